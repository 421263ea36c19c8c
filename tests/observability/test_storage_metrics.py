"""The storage's metric hooks on a real store in-process: the append lock totals kept by
the commitlog, the flush observer of the segment queue, totals per answered Append and
the sampled gauges (no meter provider is installed: instruments are no-ops)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

from services.storage.engine.config import FlushMode, StoreConfig
from services.storage.engine.message_codec import MessageInput
from services.storage.engine.message_store import MessageStore
from services.storage.engine.queue_locks import QueueLockManager
from services.storage.engine.system_topics import KEPT_TOPICS
from services.storage.metrics import StorageMetrics


def test_store_hooks_and_samples(tmp_path: Path) -> None:
    config = StoreConfig(
        store_dir=tmp_path / "store",
        segment_size_bytes=128 * 1024,
        max_message_body_bytes=64 * 1024,
        flush_mode=FlushMode.SYNC,
    )
    store = MessageStore(config, usage_ratio=lambda: 0.25)
    store.open()
    try:
        locks = QueueLockManager(1_000, grace=False)
        locks.lock("g", "member", [("T", 0), ("T", 1)])
        metrics = StorageMetrics(lambda: store, lambda: None, queue_locks=locks)
        flushes: list[tuple[float, int]] = []
        store.segments.flush_observer = lambda seconds, synced: flushes.append((seconds, synced))
        started = time.perf_counter()
        result = store.put([MessageInput("T", 0, b"x" * 100) for _ in range(5)])
        assert result.durable is not None
        result.durable.result(timeout=20)
        metrics.appended(5, result.batch, started)

        assert metrics.messages == 5
        assert metrics.bytes == result.batch.end_offset == store.segments.max_offset
        assert store.commitlog.lock_acquisitions == 1
        assert 0 <= store.commitlog.lock_wait_s < 1
        assert flushes and all(seconds >= 0 and synced >= 1 for seconds, synced in flushes)

        sample = cast(dict[str, Any], metrics.sample())
        assert sample["tide_storage_commitlog_max_offset_bytes"] == result.batch.end_offset
        assert sample["tide_storage_commitlog_flushed_offset_bytes"] == result.batch.end_offset
        assert sample["tide_storage_unflushed_bytes"] == 0
        assert sample["tide_storage_segments"] == 1
        assert sample["tide_storage_writable"] == 1
        # The topic and the system topics every store keeps (KEPT_TOPICS).
        assert sample["tide_storage_topics"] == 1 + len(KEPT_TOPICS)
        assert "tide_storage_replication_lag_bytes" not in sample  # no replication given
        assert sample["tide_storage_queue_locks"] == 2
    finally:
        store.close()

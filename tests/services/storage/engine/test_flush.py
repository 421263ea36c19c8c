"""Flushing: SYNC (group commit) and ASYNC, and the checkpoint written from it."""

from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from services.storage.engine.config import FlushMode
from services.storage.engine.message_store import MessageStore
from tests._smaps import dirty_pages
from tests.services.storage.engine.conftest import (
    SEGMENT_BYTES,
    TIMEOUT_S,
    Position,
    StoreFactory,
    msg,
    read_records,
)
from tide.format import CHECKPOINT_FILE_BYTES, Checkpoint
from tide.mapped import PAGE_BYTES, MappedFile
from tide.waiting import wait_until

NEVER_MS = 3_600_000


def read_checkpoint(store_dir: Path) -> Checkpoint:
    data = (store_dir / "checkpoint").read_bytes()
    assert len(data) == CHECKPOINT_FILE_BYTES
    return Checkpoint.unpack(data)


def counting_clock(start_ms: int = 1_700_000_000_000) -> itertools.count[int]:
    return itertools.count(start_ms, 1000)


def assert_all_flushed(segments: list[MappedFile]) -> None:
    for segment in segments:
        assert segment.flushed == segment.committed == segment.wrote, segment


# -- SYNC --------------------------------------------------------------------------------


def test_sync_put_is_durable_when_its_future_completes(make_store: StoreFactory) -> None:
    store = make_store(flush_mode=FlushMode.SYNC)
    for size in (10, 5000, 20_000):
        result = store.put([msg(body=b"s" * size), msg(queue_id=1)])
        assert result.durable is not None
        result.durable.result(timeout=TIMEOUT_S)
        assert store.segments.flushed_offset >= result.batch.end_offset
        assert store.status().flushed_offset >= result.batch.end_offset
    assert store.group_commit is not None
    assert store.group_commit.flush_count >= 1


def test_sync_empty_put_has_nothing_to_wait_for(make_store: StoreFactory) -> None:
    store = make_store(flush_mode=FlushMode.SYNC)
    assert store.put([]).durable is None


def test_group_commit_serves_many_concurrent_putters(make_store: StoreFactory) -> None:
    store = make_store(flush_mode=FlushMode.SYNC)
    threads, batches = 16, 50

    def putter(n: int) -> list[Position]:
        positions: list[Position] = []
        for i in range(batches):
            result = store.put([msg(f"T{n}", 0, b"%d-%d" % (n, i) * 20)])
            assert result.durable is not None
            result.durable.result(timeout=TIMEOUT_S)
            assert store.segments.flushed_offset >= result.batch.end_offset
            positions += result.batch.positions
        return positions

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(putter, n) for n in range(threads)]
        results = [f.result(timeout=TIMEOUT_S * 3) for f in futures]
    for positions in results:
        assert [q for _, _, q in positions] == list(range(batches))
    puts = threads * batches
    assert store.group_commit is not None
    flushes = store.group_commit.flush_count
    assert 1 <= flushes < puts, f"{flushes} fsyncs for {puts} puts: no group commit"
    assert len(read_records(store)) == puts
    assert store.segments.flushed_offset >= store.status().max_offset


def test_sync_checkpoint_follows_the_flushes(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store(
        flush_mode=FlushMode.SYNC,
        checkpoint_interval_ms=20,
        clock_ms=counting_clock().__next__,
    )
    for _ in range(3):
        result = store.put([msg()])
        assert result.durable is not None
        result.durable.result(timeout=TIMEOUT_S)
    stamp = result.batch.store_timestamp_ms
    # Written by the checkpoint thread while the store is open.
    wait_until(
        lambda: (
            (store_dir / "checkpoint").exists()
            and read_checkpoint(store_dir).physic_msg_timestamp_ms == stamp
        ),
        "the checkpoint file to record the last flushed store timestamp",
    )
    segments = list(store.segments.segments)
    store.close()
    assert_all_flushed(segments)
    checkpoint = read_checkpoint(store_dir)
    assert checkpoint.physic_msg_timestamp_ms == stamp
    assert checkpoint.logics_msg_timestamp_ms == stamp
    assert checkpoint.index_msg_timestamp_ms == stamp


# -- ASYNC -------------------------------------------------------------------------------


def test_async_flush_catches_up(make_store: StoreFactory) -> None:
    store = make_store(flush_interval_ms=10, flush_least_pages=0)
    result = store.put([msg(body=b"a" * 100)])
    assert result.durable is None
    wait_until(
        lambda: store.segments.flushed_offset >= result.batch.end_offset,
        "the async flush to reach the first batch",
    )
    # Many more, across a segment end.
    for i in range(60):
        result = store.put([msg(body=bytes([i]) * 3000)])
    wait_until(
        lambda: store.segments.flushed_offset >= result.batch.end_offset,
        "the async flush to reach the last batch",
    )
    assert store.status().segment_count == 2
    assert store.status().flushed_offset == store.status().max_offset


def test_a_flush_leaves_a_warmed_segment_writable_past_what_it_synced(
    make_store: StoreFactory,
) -> None:
    """The warm-up dirtied every page of the segment; a flush writes back the written
    pages only, so the appender's next pages stay writable (no fault on first store)."""
    store = make_store(
        warm_segments_enabled=True, flush_interval_ms=NEVER_MS, flush_thorough_interval_ms=NEVER_MS
    )
    segment = store.segments.segments[0]
    pages = SEGMENT_BYTES // PAGE_BYTES
    assert dirty_pages(segment.path) == pages
    result = store.put([msg(body=b"w" * 10_000)])
    store.segments.flush(0)
    assert store.segments.flushed_offset == result.batch.end_offset
    synced = -(-result.batch.end_offset // PAGE_BYTES)
    assert dirty_pages(segment.path) == pages - synced


def test_async_flush_waits_for_least_pages(make_store: StoreFactory) -> None:
    store = make_store(
        flush_interval_ms=5, flush_least_pages=4, flush_thorough_interval_ms=NEVER_MS
    )
    small = store.put([msg(body=b"s" * 100)]).batch
    # Deliberately lets time pass (~30 flush intervals) to show that a single dirty page
    # is not enough: there is no state to wait on for something that must not happen.
    time.sleep(0.15)
    assert store.segments.flushed_offset < small.end_offset
    big = store.put([msg(body=b"b" * 5000) for _ in range(4)]).batch  # > 4 pages dirty
    wait_until(
        lambda: store.segments.flushed_offset >= big.end_offset,
        "a flush once 4 pages are dirty",
    )


def test_thorough_flush_syncs_below_least_pages(make_store: StoreFactory) -> None:
    store = make_store(flush_interval_ms=10, flush_least_pages=1000, flush_thorough_interval_ms=50)
    batch = store.put([msg(body=b"t" * 10)]).batch
    wait_until(
        lambda: store.segments.flushed_offset >= batch.end_offset,
        "the thorough flush of less than flush_least_pages",
    )


def test_async_close_flushes_everything_and_writes_checkpoint(
    make_store: StoreFactory, store_dir: Path
) -> None:
    # The flush thread never runs on its own: only close() flushes.
    store = make_store(
        flush_interval_ms=NEVER_MS,
        flush_thorough_interval_ms=NEVER_MS,
        clock_ms=counting_clock().__next__,
    )
    stamps = [store.put([msg(body=b"c" * 20_000)] * 3).batch.store_timestamp_ms for _ in range(4)]
    assert store.segments.flushed_offset < store.status().max_offset
    segments = list(store.segments.segments)
    assert len(segments) >= 2
    store.close()
    assert_all_flushed(segments)
    checkpoint = read_checkpoint(store_dir)
    assert checkpoint.physic_msg_timestamp_ms == stamps[-1]
    assert checkpoint.logics_msg_timestamp_ms == stamps[-1]
    assert checkpoint.index_msg_timestamp_ms == stamps[-1]


def test_reopen_after_close_reads_everything(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store(flush_mode=FlushMode.SYNC)
    bodies = [bytes([i]) * (i * 300) for i in range(60)]
    for body in bodies:
        store.put([msg(body=body)])
    end = store.status().max_offset
    store.close()
    reopened: MessageStore = make_store(flush_mode=FlushMode.SYNC)
    assert reopened.recovery is not None
    assert reopened.recovery.mode == "normal"
    assert reopened.status().max_offset == end
    assert reopened.status().flushed_offset == end
    assert [r.body for r in read_records(reopened)] == bodies
    assert reopened.put([msg()]).batch.positions[0][2] == len(bodies)

"""Persists recovery aids on an interval: the checkpoint file, the queue offset snapshot
and the consumer offsets.

A snapshot of the queue offset table is captured under the append lock (with the
commitlog offset it matches) and written only once the commitlog is flushed past that
offset, so recovery never meets a snapshot that counts records a crash could lose.
"""

from __future__ import annotations

import time
from pathlib import Path

from services.storage.engine.checkpoint import StoreCheckpoint
from services.storage.engine.commitlog import CommitLog
from services.storage.engine.consumer_offsets import ConsumerOffsets
from services.storage.engine.disk_guard import DiskGuard
from tide.files import is_out_of_space
from tide.format import Snapshot, write_snapshot
from tide.service_thread import ServiceThread

SNAPSHOT_INTERVAL_S = 10.0


class CheckpointService(ServiceThread):
    name = "storage.checkpoint"

    def __init__(
        self,
        store_dir: Path,
        commitlog: CommitLog,
        checkpoint: StoreCheckpoint,
        consumer_offsets: ConsumerOffsets,
        *,
        interval_ms: int,
        guard: DiskGuard | None = None,
    ) -> None:
        super().__init__(interval_ms / 1000)
        self._store_dir = store_dir
        self._commitlog = commitlog
        self._checkpoint = checkpoint
        self._consumer_offsets = consumer_offsets
        self._guard = guard
        self._pending: Snapshot | None = None
        self._last_snapshot_s = 0.0
        self.snapshots_written = 0

    def capture(self) -> Snapshot:
        with self._commitlog.lock:
            offset = self._commitlog.segments.max_offset
            table = dict(self._commitlog.offsets.next_offsets)
        return Snapshot(offset, 0, table)

    def run_once(self) -> None:
        """One round; a full disk (ENOSPC) is the store's disk-full state, not a failure
        of this thread: the store refuses appends and the next round retries."""
        try:
            self._run_round()
        except OSError as exc:
            if self._guard is None or not is_out_of_space(exc):
                raise
            self._guard.out_of_space(exc, f"writing {exc.filename or 'the checkpoint'}")

    def _run_round(self) -> None:
        self._checkpoint.flush()
        now = time.monotonic()
        flushed = self._commitlog.segments.flushed_offset
        if self._pending is not None and flushed >= self._pending.commitlog_offset:
            self._pending.flushed_offset = flushed
            write_snapshot(self._store_dir, self._pending)
            self.snapshots_written += 1
            self._pending = None
        if self._pending is None and now - self._last_snapshot_s >= SNAPSHOT_INTERVAL_S:
            self._pending = self.capture()
            self._last_snapshot_s = now
        self._consumer_offsets.maybe_persist(int(time.time() * 1000))

    def discard_pending(self) -> None:
        """Forget a captured snapshot: the commitlog was cut below it (a slave truncating
        to its master's end). Call under the commitlog lock."""
        self._pending = None

    def write_final(self) -> None:
        """At close, after the final flush: everything current and durable."""
        snapshot = self.capture()
        snapshot.flushed_offset = self._commitlog.segments.flushed_offset
        assert snapshot.flushed_offset >= snapshot.commitlog_offset, snapshot
        write_snapshot(self._store_dir, snapshot)
        self._checkpoint.flush()
        self._consumer_offsets.persist()

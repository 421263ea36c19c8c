"""Keeps the idempotent producers' window durable and bounded: a snapshot every
``producer_state_snapshot_interval_ms`` (and at close), idle ids expired each round; and
rebuilds the window at open from the snapshot plus the records after it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

from services.storage.engine.commitlog import CommitLog
from services.storage.engine.producer_state import ProducerStateTable
from tide.commitlog import iter_records
from tide.service_thread import ServiceThread

log = logging.getLogger("tide.storage.producer_state")


class ProducerStateService(ServiceThread):
    name = "storage.producer_state"

    def __init__(
        self,
        table: ProducerStateTable,
        commitlog: CommitLog,
        interval_ms: int,
        is_master: Callable[[], bool],
    ) -> None:
        """``is_master``: False on a slave, whose file is its master's copy (installed by
        the metadata sync): a slave neither writes nor expires anything itself."""
        super().__init__(interval_ms / 1000)
        self._is_master = is_master
        self._table = table
        self._commitlog = commitlog
        self._written_offset = -1
        self.snapshots_written = 0

    def run_once(self) -> None:
        if not self._is_master():
            return
        commitlog = self._commitlog
        with commitlog.lock:  # a copy consistent with the commitlog's end
            expired = self._table.expire(commitlog.clock_ms())
            offset = commitlog.segments.max_offset
            if offset == self._written_offset and not expired:
                return  # nothing appended since the last snapshot
            snapshot = self._table.copy(offset)
        self._table.write(snapshot)
        self._written_offset = offset
        self.snapshots_written += 1
        if expired:
            log.info("forgot %d idle idempotent producer id(s)", expired)

    def on_stop(self) -> None:
        self.run_once()  # the final snapshot: the next open replays nothing


def rebuild_producer_state(table: ProducerStateTable, commitlog_dir: Path, end: int) -> None:
    """Load the snapshot, drop what a crash cut off (batches at or past the recovered
    ``end``), and replay the records from the snapshot's offset to ``end``."""
    start = min(table.load(), end)
    table.drop_from(end)
    if start >= end:
        return
    batches = table.replay(_records(commitlog_dir, start, end))
    log.info("idempotent producers: replayed %d batch(es) from offset %d", batches, start)


def _records(
    commitlog_dir: Path, start: int, end: int
) -> Iterator[tuple[int, int, str, int, int, int, dict[str, str]]]:
    for at in iter_records(commitlog_dir, start, check_crc=False):
        if at.offset >= end:
            return
        rec = at.record
        yield (
            at.offset,
            rec.total_size,
            rec.topic,
            rec.queue_id,
            rec.queue_offset,
            rec.store_timestamp_ms,
            rec.properties,
        )

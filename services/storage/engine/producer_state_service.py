"""Keeps the idempotent producers' window durable and bounded: a snapshot every
``producer_state_snapshot_interval_ms`` (and at close) when producers changed, idle ids
expired each round; and rebuilds the window at open from the snapshot plus the records
after it.

The append lock is held only to take the changes (the producers recorded or expired
since the last snapshot, copied: O(changed), not O(table)); they are merged into the
service's own copy of the table and the snapshot is encoded and written outside it.
Nothing is written when no producer changed, except to move the snapshot's offset
forward after ``UNCHANGED_REWRITE_BYTES`` of commitlog (and at close), which keeps the
replay at open short."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

from services.storage.engine.commitlog import CommitLog
from services.storage.engine.producer_state import ProducerStateTable
from tide.commitlog import first_store_timestamp_ms, iter_records, open_segments
from tide.format import ProducerEntry, ProducerStateSnapshot
from tide.service_thread import ServiceThread

log = logging.getLogger("tide.storage.producer_state")
# An unchanged table is written again once the commitlog moved this far past its last
# snapshot (and at close), so that the replay at open stays short.
UNCHANGED_REWRITE_BYTES = 64 << 20


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
        # The table as of the last snapshot, kept up to date from the changes taken
        # under the lock: only the producers changed since are copied there.
        self._copy: dict[str, ProducerEntry] = {}
        self._written_offset = -1  # the commitlog offset of the last snapshot written
        self.snapshots_written = 0
        self.entries_copied = 0  # producers copied under the append lock, in all

    def run_once(self, *, final: bool = False) -> None:
        """``final`` (at close): written even when unchanged if the commitlog moved, so
        the next open replays nothing."""
        if not self._is_master():
            return
        commitlog = self._commitlog
        with commitlog.lock:  # changes consistent with the commitlog's end
            expired = self._table.expire(commitlog.clock_ms())
            changes = self._table.take_changes()
            offset = commitlog.segments.max_offset
        if expired:
            log.info("forgot %d idle idempotent producer id(s)", expired)
        if changes is None:
            # The last snapshot holds the table; the records appended since carry no
            # producer (else one would have changed), so a replay from its older offset
            # finds the same. Rewritten (from the copy, no work under the lock) only to
            # keep that replay short.
            moved = offset - self._written_offset
            if self._written_offset < 0 or not (
                moved >= UNCHANGED_REWRITE_BYTES or (final and moved > 0)
            ):
                return
        else:
            self.entries_copied += len(changes.changed)
            if changes.everything:
                self._copy = changes.changed
            else:
                self._copy.update(changes.changed)
                for pid in changes.removed:
                    self._copy.pop(pid, None)
        # Merged before the write: a failed write leaves them for the next snapshot.
        self._table.write(ProducerStateSnapshot(offset, self._copy))
        self._written_offset = offset
        self.snapshots_written += 1

    def on_stop(self) -> None:
        self.run_once(final=True)  # the final snapshot: the next open replays nothing


def rebuild_producer_state(
    table: ProducerStateTable, commitlog_dir: Path, end: int, clock_ms: Callable[[], int]
) -> int:
    """Load the snapshot, drop what a crash cut off (batches at or past the recovered
    ``end``), and replay the records from the snapshot's offset to ``end``, or from
    :func:`replay_floor` when that is later (a store without a snapshot, or an old one):
    the producers of the records before it would be expired anyway. The offset the
    replay started from. ``clock_ms``: the store clock, read only when there is a
    commitlog to replay."""
    start = min(table.load(), end)
    table.drop_from(end)
    if start >= end:
        return start
    now_ms = clock_ms()
    floor = replay_floor(commitlog_dir, now_ms - table.expiry_ms, end)
    if floor > start:
        # Every producer the snapshot (if any) holds appended before the floor, so it
        # is idle past the expiry: only the records from the floor on matter.
        table.clear()
        start = floor  # below end: the floor is a segment's start before it
    batches = table.replay(_records(commitlog_dir, start, end))
    expired = table.expire(now_ms)  # those of the floor's segment older than the expiry
    log.info(
        "idempotent producers: replayed %d batch(es) from offset %d (%d expired)",
        batches,
        start,
        expired,
    )
    return start


def replay_floor(commitlog_dir: Path, cutoff_ms: int, end: int) -> int:
    """The start of the last segment whose first record was stored before ``cutoff_ms``
    (0 when none): every record of the segments before it is older than that (store
    times only grow), so their producers are idle past the expiry. One record read per
    segment, from the oldest, until a segment starts at or past the cutoff."""
    floor = 0
    for segment in open_segments(commitlog_dir):
        if segment.start_offset >= end:
            break
        stored_ms = first_store_timestamp_ms(segment)
        if stored_ms is None or stored_ms >= cutoff_ms:
            break
        floor = segment.start_offset
    return floor


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

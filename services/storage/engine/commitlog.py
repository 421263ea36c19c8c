"""CommitLog: appends encoded records under one lock, serves reads.

The records arrive fully encoded, as one :class:`RecordRun` (from the store's codec or
checked from a producer's run); under the lock the appender only picks positions,
assigns queue offsets, patches three fields per record and copies the run's bytes in.
A record never spans segments: when ``size + 8`` bytes do not fit
in the rest of a segment, a blank marker ends it and the record goes to the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.storage.engine.disk_guard import DiskGuard
from services.storage.engine.errors import DiskFullError, NotWritableError
from services.storage.engine.queue_offsets import QueueKey, QueueOffsetTable
from services.storage.engine.record_run import RecordRun
from services.storage.engine.segment_files import SegmentSpaceError, unlock
from services.storage.engine.segment_queue import SegmentQueue
from tide.format import (
    BLANK_MARKER_BYTES,
    TOTAL_SIZE_BYTES,
    DecodedRecord,
    RecordError,
    decode_record,
    find_blank_marker,
    patch_run,
    record_size,
    record_total_size,
    segment_name,
    write_blank,
)
from tide.limits import RECORD_MAX_BYTES
from tide.mapped import MappedFile, reads_through_file

log = logging.getLogger("tide.storage.commitlog")
MIN_RECORD_BYTES = record_size(0, 1, 0)  # no body, a 1-byte topic, no properties
AppendListener = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class AppendBatch:
    store_timestamp_ms: int
    # Per record, in request order.
    physical_offsets: list[int]
    sizes: list[int]
    queue_offsets: list[int]
    # Offset just past the last record: durable once flushed_offset >= end_offset.
    end_offset: int

    @property
    def positions(self) -> list[tuple[int, int, int]]:
        """(physical_offset, size, queue_offset) per record."""
        return list(zip(self.physical_offsets, self.sizes, self.queue_offsets, strict=True))


class OffsetBelowMinError(Exception):
    """The offset was deleted by retention."""


def _no_earlier() -> AppendBatch | None:
    return None  # a plain append repeats nothing


def _ignore(batch: AppendBatch) -> None:
    pass


def _pieces(sizes: Sequence[int], pos: int, limit: int) -> list[tuple[int, int]]:
    """The records (first, stop) that go into each segment, from ``pos`` of one of
    ``limit`` bytes: a record that does not fit with a blank marker after it goes into
    the next. The first piece is empty when not even the first record fits."""
    if pos + sum(sizes) + BLANK_MARKER_BYTES <= limit:
        return [(0, len(sizes))]  # the usual case
    pieces: list[tuple[int, int]] = []
    first = 0
    for index, size in enumerate(sizes):
        if pos + size + BLANK_MARKER_BYTES > limit:
            pieces.append((first, index))
            first, pos = index, 0
        pos += size
    pieces.append((first, len(sizes)))
    return pieces


class CommitLog:
    def __init__(
        self,
        segments: SegmentQueue,
        offsets: QueueOffsetTable,
        store_host: bytes,
        *,
        clock_ms: Callable[[], int] | None = None,
        attach_write_buffer: Callable[[MappedFile], None] | None = None,
        max_record_bytes: int = RECORD_MAX_BYTES,
        guard: DiskGuard | None = None,
    ) -> None:
        self.segments = segments
        self.offsets = offsets
        # store_timestamp and the store host follow each other: patched together (a run
        # from a producer carries zeros in both).
        assert len(store_host) in (8, 20), len(store_host)
        self._store_host = store_host
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._attach_write_buffer = attach_write_buffer
        # A blank marker is less than one record (+ the 8-byte reserve) from the end.
        self._max_record_bytes = max_record_bytes
        self.lock = threading.Lock()
        self._last_store_timestamp_ms = 0
        self._listeners: list[AppendListener] = []
        # Set by close() when closing (a full disk is the guard's to say).
        self.refuse_reason: str | None = None
        self.guard = guard
        # Segment start offset -> the queue offset table as its first record went in:
        # which queue offsets retention deletes with the segments before it.
        self.queue_offsets_at_start: dict[int, dict[QueueKey, int]] = {}
        # Metrics: appends and their total wait for the lock (seconds), kept under it.
        self.lock_acquisitions = 0
        self.lock_wait_s = 0.0

    def add_listener(self, listener: AppendListener) -> None:
        """Called (outside the lock) with the new max offset after every append."""
        self._listeners = [*self._listeners, listener]

    def remove_listener(self, listener: AppendListener) -> None:
        self._listeners = [x for x in self._listeners if x is not listener]

    def clock_ms(self) -> int:
        """The store clock (ms since epoch) appends are stamped with."""
        return self._clock_ms()

    @property
    def last_store_timestamp_ms(self) -> int:
        return self._last_store_timestamp_ms

    # -- appending ---------------------------------------------------------------
    def append(self, run: RecordRun) -> AppendBatch:
        if not run.sizes:
            return AppendBatch(self._last_store_timestamp_ms, [], [], [], self.segments.max_offset)
        batch, _ = self.append_checked(run, _no_earlier, _ignore)
        return batch

    def append_checked(
        self,
        run: RecordRun,
        check: Callable[[], AppendBatch | None],
        appended: Callable[[AppendBatch], None],
    ) -> tuple[AppendBatch, bool]:
        """An append (an idempotent producer's; a plain one checks nothing): under the
        lock, ``check`` answers the batch a
        retry repeats (nothing is written: (it, False)), or None, and then the run is
        appended and ``appended`` records it before the lock is let go: (batch, True)."""
        asked = time.perf_counter()
        with self.lock:
            self.lock_wait_s += time.perf_counter() - asked
            self.lock_acquisitions += 1
            self._check_writable()
            earlier = check()
            if earlier is not None:
                return earlier, False
            batch = self._append_locked(run)
            appended(batch)
        for listener in self._listeners:
            listener(batch.end_offset)
        return batch, True

    def _check_writable(self) -> None:
        if self.refuse_reason is not None:
            raise NotWritableError(self.refuse_reason)
        if self.guard is not None:
            self.guard.check()

    @property
    def writable(self) -> bool:
        return self.refuse_reason is None and (self.guard is None or not self.guard.full)

    def writable_segment(self) -> MappedFile:
        """The segment holding the write position (created if it does not exist yet)."""
        offset = self.segments.max_offset
        segment = self.segments.find(offset)
        return segment if segment is not None else self._roll(offset)

    def _roll(self, start_offset: int) -> MappedFile:
        try:
            segment = self.segments.next_segment(start_offset)
        except SegmentSpaceError as exc:
            if self.guard is None:
                raise DiskFullError(f"no space for a new commitlog segment: {exc}") from exc
            what = f"creating commitlog segment {segment_name(start_offset)}"
            raise self.guard.out_of_space(exc, what) from exc
        if self._attach_write_buffer is not None:
            self._attach_write_buffer(segment)
        return segment

    def _append_locked(self, run: RecordRun) -> AppendBatch:
        """Offsets, the store time and host patched into ``run.data``, then the bytes copied
        into the segment(s): one ``patch_run`` and one slice assignment per segment."""
        now = max(self._clock_ms(), self._last_store_timestamp_ms)
        segment = self.writable_segment()
        if segment.wrote > 0 and segment.wrote + len(run.data) + BLANK_MARKER_BYTES <= (
            segment.size_bytes
        ):
            return self._append_within(run, segment, now)  # the usual case
        self._ensure_room(run.sizes)
        source = memoryview(run.data)
        physical: list[int] = []
        queue_offsets: list[int] = []
        at = 0  # in data: the next record
        for number, (first, stop) in enumerate(
            _pieces(run.sizes, segment.wrote, segment.size_bytes)
        ):
            if number:  # the run goes on in the next segment
                segment = self._next_segment(segment, now)
            if segment.wrote == 0:
                self._mark_queue_offsets(segment)
            if stop == first:
                continue  # (the first record did not fit the first segment)
            sizes = run.sizes[first:stop]
            piece = source[at : at + sum(sizes)]
            pos = segment.wrote
            found = patch_run(
                piece,
                sizes,
                run.queue_keys[first:stop],
                run.store_timestamp_positions[first:stop],
                self.offsets.next_offsets,
                segment.start_offset + pos,
                now,
                self._store_host,
            )
            physical += found[0]
            queue_offsets += found[1]
            segment.write_target[pos : pos + len(piece)] = piece
            self._publish(segment, pos + len(piece), now)
            at += len(piece)
        assert at == len(run.data), (at, len(run.data))
        self._last_store_timestamp_ms = now
        end = segment.start_offset + segment.wrote
        return AppendBatch(now, physical, run.sizes, queue_offsets, end)

    def _append_within(self, run: RecordRun, segment: MappedFile, now: int) -> AppendBatch:
        """:meth:`_append_locked` of a run that fits the rest of a segment already
        written to: one patch and one copy, no piece of any column (``patch_run``
        checks that the sizes add up to the run's bytes)."""
        pos = segment.wrote
        data = run.data
        physical, queue_offsets = patch_run(
            data,
            run.sizes,
            run.queue_keys,
            run.store_timestamp_positions,
            self.offsets.next_offsets,
            segment.start_offset + pos,
            now,
            self._store_host,
        )
        segment.write_target[pos : pos + len(data)] = data
        self._publish(segment, pos + len(data), now)
        self._last_store_timestamp_ms = now
        return AppendBatch(
            now, physical, run.sizes, queue_offsets, segment.start_offset + segment.wrote
        )

    def _next_segment(self, segment: MappedFile, now: int) -> MappedFile:
        """End ``segment`` with a blank marker; the next one (made by _ensure_room)."""
        pos, limit = segment.wrote, segment.size_bytes
        write_blank(segment.write_target, pos, limit - pos)
        segment.blank_position = pos
        self._publish(segment, limit, now)
        next_segment = self.segments.find(segment.end_offset)
        assert next_segment is not None and next_segment.wrote == 0, next_segment
        return next_segment

    def _ensure_room(self, sizes: Sequence[int]) -> None:
        """Create every segment this batch will need before writing any byte, so that a
        failure to create one (disk full) leaves nothing half-written."""
        segment = self.writable_segment()
        pos, limit = segment.wrote, segment.size_bytes
        if pos + sum(sizes) + BLANK_MARKER_BYTES <= limit:
            return  # the common case: it all fits
        next_start = segment.end_offset
        for size in sizes:
            if pos + size + BLANK_MARKER_BYTES > limit:
                if self.segments.find(next_start) is None:
                    self._roll(next_start)
                next_start += limit
                pos = 0
            pos += size

    def _mark_queue_offsets(self, segment: MappedFile) -> None:
        """Before the first record goes into ``segment`` (once per segment: a copy of
        the table, one entry per queue)."""
        self.queue_offsets_at_start[segment.start_offset] = dict(self.offsets.next_offsets)

    @staticmethod
    def _publish(segment: MappedFile, position: int, now: int) -> None:
        """Make ``segment[:position]`` visible (after the bytes are in place)."""
        segment.last_store_timestamp_ms = now
        segment.wrote = position
        if segment.write_buffer is None:
            segment.committed = position
        if segment.locked and segment.is_full:
            unlock(segment)

    # -- replication: a slave writes its master's bytes (engine/ha_replica_writer.py) --
    def publish_replicated(self, segment: MappedFile, position: int, timestamp_ms: int) -> None:
        """Under the lock: make ``segment[:position]`` (bytes copied from the master, whole
        records) visible, with ``timestamp_ms`` the store timestamp of the last one."""
        self._publish(segment, position, timestamp_ms)
        self._last_store_timestamp_ms = max(self._last_store_timestamp_ms, timestamp_ms)

    def notify_listeners(self, end_offset: int) -> None:
        """Outside the lock, after :meth:`publish_replicated`: wake Tail streams."""
        for listener in self._listeners:
            listener(end_offset)

    # -- reading -----------------------------------------------------------------
    def read_record(self, offset: int, size: int) -> DecodedRecord:
        """Decode the record at ``offset`` (``size`` 0: the size the record says). Raises
        OffsetBelowMinError, IndexError (past the readable end) or RecordError (no record
        of that size there)."""
        if size == 0:
            size = self.record_size_at(offset)
        data = self._read_bytes(offset, size)
        record = decode_record(data, 0, len(data), expected_offset=offset)
        if record.total_size != size:
            raise RecordError(f"the record at {offset} is {record.total_size} bytes, not {size}")
        return record

    def record_size_at(self, offset: int) -> int:
        """The TOTALSIZE field at ``offset`` (RecordError when it cannot be a record)."""
        size = record_total_size(self._read_bytes(offset, TOTAL_SIZE_BYTES), 0)
        if not MIN_RECORD_BYTES <= size <= self.segments.size_bytes:
            raise RecordError(f"no record at {offset}: its size field says {size}")
        return int(size)

    def _read_bytes(self, offset: int, size: int) -> bytes:
        if offset < self.segments.min_offset:
            raise OffsetBelowMinError(f"offset {offset} is below the min offset")
        segment = self.segments.find(offset)
        if segment is None or not segment.hold():
            if offset < self.segments.min_offset:
                raise OffsetBelowMinError(f"offset {offset} is below the min offset")
            raise IndexError(f"offset {offset} is past the end of the commitlog")
        try:
            pos = offset - segment.start_offset
            if pos + size > segment.committed:
                raise IndexError(f"offset {offset} + {size} is past the readable end")
            return segment.read(pos, size)
        finally:
            segment.release()

    def read_raw(self, offset: int, max_bytes: int) -> tuple[int, bytes]:
        """Up to ``max_bytes`` readable bytes from ``offset`` as they are in the file,
        never across a segment end. ``data`` is empty when nothing is readable there yet.
        An offset at the end of a full segment continues at the next one."""
        return self._read_chunk(offset, max_bytes, skip_filler=False)

    def read_tail(self, offset: int, max_bytes: int) -> tuple[int, bytes]:
        """Like :meth:`read_raw` for the Tail stream: a chunk ends with a segment's blank
        marker (8 bytes) and the filler after it is skipped: the next read (or an offset
        inside the filler) continues at the next segment's start."""
        return self._read_chunk(offset, max_bytes, skip_filler=True)

    def read_tail_framed(
        self, offset: int, max_bytes: int, frame: Callable[[int, int], tuple[bytes, bytes]]
    ) -> tuple[int, int, bytes]:
        """:meth:`read_tail`'s chunk copied once out of the mapping, between the bytes
        ``frame(start, size)`` gives (the Tail's answer framed by hand: no copy of the
        chunk into and out of a message). Returns (start, size, framed); size 0: no data
        (framed is then empty)."""
        found: list[tuple[int, int]] = []
        through_file = reads_through_file()

        def take(segment: MappedFile, start: int, pos: int, size: int) -> bytes:
            head, tail = frame(start, size)
            found.append((start, size))
            if through_file:  # a cold read's thread: pread, not the mapping
                return b"".join((head, segment.read(pos, size), tail))
            with memoryview(segment.mm) as mapping, mapping[pos : pos + size] as data:
                return b"".join((head, data, tail))

        framed = self._read_chunk(offset, max_bytes, skip_filler=True, take=take)[1]
        start, size = found[0] if found else (offset, 0)
        return start, size, framed

    def _read_chunk(
        self,
        offset: int,
        max_bytes: int,
        *,
        skip_filler: bool,
        take: Callable[[MappedFile, int, int, int], bytes] | None = None,
    ) -> tuple[int, bytes]:
        """``take(segment, offset, position, size)`` turns the chunk found into bytes
        while the segment is held (default: a copy of it)."""
        if offset < self.segments.min_offset:
            raise OffsetBelowMinError(
                f"offset {offset} is below the commitlog min offset {self.segments.min_offset}"
            )
        segment = self.segments.find(offset)
        if segment is None or not segment.hold():
            return offset, b""
        try:
            pos = offset - segment.start_offset
            end = min(segment.committed, pos + max_bytes)
            blank = -1
            if skip_filler and segment.committed == segment.size_bytes:
                blank = self._blank_position(segment)
            if blank < 0 or pos < blank + BLANK_MARKER_BYTES:
                if blank >= 0:
                    end = min(end, blank + BLANK_MARKER_BYTES)
                if end <= pos:
                    return offset, b""
                if take is None:
                    return offset, segment.read(pos, end - pos)
                return offset, take(segment, offset, pos, end - pos)
        finally:
            segment.release()
        return self._read_chunk(segment.end_offset, max_bytes, skip_filler=True, take=take)

    def resident(self, offset: int, size: int) -> bool:
        """Whether the readable bytes of ``[offset, offset + size)`` are in memory, so that
        reading them from the mappings takes no disk read (MappedFile.resident). Bytes
        not readable (below the min offset, past the end) count as in memory: the read
        answers them at once."""
        end = offset + size
        while offset < end:
            segment = self.segments.find(offset)
            if segment is None or not segment.hold():
                return True
            try:
                pos = offset - segment.start_offset
                readable = min(segment.committed, pos + end - offset) - pos
                if readable > 0 and not segment.resident(pos, readable):
                    return False
            finally:
                segment.release()
            offset = segment.end_offset
        return True

    def _blank_position(self, segment: MappedFile) -> int:
        """Where the blank marker of a full segment is (cached), or -1. It sits within the
        largest record of the end, so a bounded search from the end finds it."""
        if segment.blank_position is None:
            start = max(-1, segment.size_bytes - self._max_record_bytes - 1)
            segment.blank_position = find_blank_marker(segment.mm, start, segment.size_bytes)
        return segment.blank_position


__all__ = ["AppendBatch", "CommitLog", "OffsetBelowMinError", "RecordError"]

"""ConsumeQueue: the 20-byte entries of one (topic, queue id) (RocketMQ's ConsumeQueue).

Layout: docs/formats.md, "Consume queue"; helpers in tide/format/_consume_queue.py.
Segments are ``<root>/consumequeue/<topic>/<queue_id>/<20-digit start byte offset>``,
``entries_per_segment * 20`` bytes each, mapped with tide.mapped.MappedFile and created
synchronously when the writer needs one (temporary name, posix_fallocate, rename, fsync of
the directory): they are small, RocketMQ creates them inline too. A full disk fails the
creation before anything is written (the free space is checked first; a partly
allocated file is removed), and a run creates every segment it needs before it writes
its first entry: a put either writes all its entries or none.

Lifecycle: ``load()`` maps the files, ``recover()`` finds the end; then ``put`` etc.

Threads: one writer (the dispatcher) calls put, truncate_past, delete_below and close
(serialized by a lock anyway); flush may run on another thread. Readers (get, get_bytes,
entry_at, search_first, last_entry, min_offset, max_offset) may run on any thread
meanwhile:

* the segment list is replaced, never mutated in place;
* put writes the entry bytes, then publishes ``max_offset``; a reader captures
  ``max_offset`` first (then the segment list) and reads nothing at or past it, so it
  never sees a half-written entry;
* a reader pins a segment (MappedFile.hold) while it copies bytes out of it; deleting a
  segment waits for that (forcing after DESTROY_FORCE_MS);
* truncate_past rewrites entries below a captured ``max_offset`` (zeros them), so it
  works as a sequence lock: a read it overlaps is retried (get, then an empty list) or
  fails with ConsumeQueueChangedError (search_first, last_entry: retry), as does a
  search that needs a segment retention deleted meanwhile;
* close only once readers are done (a read racing close can fail on a closed mapping).

RocketMQ behaviour kept: recovery scans the last three segments for the first entry
that is not written (``offset >= 0 && size > 0``), later segments are deleted;
PRE_BLANK ``(0, Integer.MAX_VALUE, 0)`` pads a queue whose first entry is not at the
start of its segment; truncation drops a segment whose first entry points at or past
the cut; segment deletion looks at each segment's last entry and never deletes the
last segment. Differences: puts are idempotent by queue offset (RocketMQ skips by
commitlog offset and appends at its write position even when the queue offset does not
match; here a gap is padded with PRE_BLANK entries so entry ``n`` stays at byte
``n * 20``); truncated and unwritten tails are zeroed on disk (RocketMQ leaves them to be
overwritten); the minimum offset is found by a binary search that skips PRE_BLANK
entries (RocketMQ scans the first segment, and can settle on a PRE_BLANK when the
commitlog minimum is 0).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from operator import add, le
from pathlib import Path
from typing import NamedTuple, TypeVar

from tide.files import allocate_file, fsync_dir
from tide.format import (
    DEFAULT_ENTRIES_PER_SEGMENT,
    ENTRY_BYTES,
    PRE_BLANK_ENTRY,
    PRE_BLANK_SIZE,
    consume_queue_segment_bytes,
    first_queue_offset,
    first_unwritten,
    iter_entries,
    logical_position,
    pack_entries,
    pack_entry_into,
    parse_segment_name,
    position_in_segment,
    segment_name,
    segment_start_for,
    unpack_entry,
)
from tide.mapped import MappedFile
from tide.naming import topic_error

log = logging.getLogger("tide.dispatch.consume_queue")

MAX_ENTRIES_PER_SEGMENT = 10_000_000  # 200 MB segments; RocketMQ's default is 300,000
MAX_SEGMENTS_PER_QUEUE = 100_000
MAX_GET_ENTRIES = 65_536  # one get() call
MAX_PAD_SEGMENTS = 16  # segments one put may create to pad a gap in queue offsets
MAX_QUEUE_ID = 2**31 - 1  # a Java int
MAX_QUEUE_OFFSET = (2**63 - 1) // ENTRY_BYTES - 1  # its byte position fits an i64
DESTROY_FORCE_MS = 1_000  # a reader pins a segment for microseconds
RECOVER_SEGMENTS = 3  # RocketMQ's recover() starts at the third segment from the end
ALLOC_SUFFIX = ".alloc"

_READ_ATTEMPTS = 3  # get() retries a read a truncation overlapped
_T = TypeVar("_T")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_ZERO_ENTRY = bytes(ENTRY_BYTES)
_SCAN_CHUNK_ENTRIES = 4096
_PRE_BLANK_CHUNK = PRE_BLANK_ENTRY * _SCAN_CHUNK_ENTRIES
_WRITE_CHUNK_BYTES = len(_PRE_BLANK_CHUNK)


class ConsumeQueueError(Exception):
    """Base class of this module's errors."""


class ConsumeQueueCorruptError(ConsumeQueueError):
    """The files on disk cannot be a consume queue (gap, wrong size, bad start)."""


class ConsumeQueueConflictError(ConsumeQueueError):
    """A put names a queue offset that already holds a different entry."""


class ConsumeQueueOrderError(ConsumeQueueError):
    """A put would break the queue's order (commitlog offset going back, too wide a gap)."""


class ConsumeQueueChangedError(ConsumeQueueError):
    """A segment a reader needed was deleted under it (retention, truncation); retry."""


class Entry(NamedTuple):
    queue_offset: int
    commitlog_offset: int
    size: int
    tags_code: int

    @property
    def is_pre_blank(self) -> bool:
        return (self.commitlog_offset, self.size, self.tags_code) == (0, PRE_BLANK_SIZE, 0)

    @property
    def commitlog_end(self) -> int:
        return self.commitlog_offset + self.size


class Recovered(NamedTuple):
    max_offset: int  # the next queue offset to write
    max_commitlog_end: int  # end of the last entry's record in the commitlog; 0 for none


def make_dirs(directory: Path) -> None:
    """mkdir -p, fsyncing the parent of every directory it creates."""
    missing: list[Path] = []
    path = directory
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for path in reversed(missing):
        path.mkdir(exist_ok=True)
        fsync_dir(path.parent)


def check_put_args(queue_offset: int, commitlog_offset: int, size: int, tags_code: int) -> None:
    if not 0 <= queue_offset <= MAX_QUEUE_OFFSET:
        raise ValueError(f"queue offset {queue_offset} is outside 0..{MAX_QUEUE_OFFSET}")
    if not 0 < size < PRE_BLANK_SIZE:
        raise ValueError(f"size {size} is outside 1..{PRE_BLANK_SIZE - 1}")
    if not 0 <= commitlog_offset <= _I64_MAX - size:
        raise ValueError(f"commitlog offset {commitlog_offset} (size {size}) is out of range")
    if not _I64_MIN <= tags_code <= _I64_MAX:
        raise ValueError(f"tags code {tags_code} does not fit in 64 bits")


def _cleanup_key(commitlog_min_offset: int, segments: list[MappedFile]) -> tuple[int, int, int]:
    """What a delete_below pass depends on besides the entries' contents."""
    return commitlog_min_offset, segments[0].start_offset if segments else -1, len(segments)


def _write_at(segment: MappedFile, position: int, data: bytes, start: int, count: int) -> None:
    """``data[start : start + count]`` into ``segment`` at ``position``: with ``pwrite``
    on its file rather than through its mapping (the same page cache, so readers of the
    mapping see it, and the segment's fdatasync covers it): a first write to a page
    through the mapping costs a page fault, several times the cost of the write."""
    with memoryview(data) as view:
        written = os.pwrite(segment.fileno, view[start : start + count], position)
    if written != count:  # pragma: no cover - a regular file writes everything or raises
        raise OSError(f"{segment.path}: wrote {written} of {count} bytes at {position}")


def _lands_on_zeros(segment: MappedFile, position: int, end: int) -> bool:
    """Whether ``segment``'s bytes ``[position, end)`` are all zero on disk: a write must
    land on zeros (an entry is never overwritten in place).

    Read with ``pread``, not through the mapping (a first read of a page through it
    faults). Its cost is mostly the page-cache pages it brings in, which the write
    would bring in anyway: measured against no check at all, reading them first is not
    slower (docs/performance.md, "Dispatch apply: where the time goes")."""
    return os.pread(segment.fileno, end - position, position) == bytes(end - position)


class ConsumeQueue:
    def __init__(
        self,
        root: Path,
        topic: str,
        queue_id: int,
        entries_per_segment: int = DEFAULT_ENTRIES_PER_SEGMENT,
    ) -> None:
        error = topic_error(topic)
        if error:
            raise ValueError(error)
        if type(queue_id) is not int or not 0 <= queue_id <= MAX_QUEUE_ID:
            raise ValueError(f"queue id {queue_id!r} is outside 0..{MAX_QUEUE_ID}")
        if not 1 <= entries_per_segment <= MAX_ENTRIES_PER_SEGMENT:
            raise ValueError(
                f"entries per segment {entries_per_segment} is outside 1..{MAX_ENTRIES_PER_SEGMENT}"
            )
        self.topic = topic
        self.queue_id = queue_id
        self.entries_per_segment = entries_per_segment
        self.segment_bytes = consume_queue_segment_bytes(entries_per_segment)
        self.directory = root / "consumequeue" / topic / str(queue_id)
        self._segments: list[MappedFile] = []
        self._min_offset = 0
        self._max_offset = 0
        self._max_commitlog_end = 0
        self._flushed_where = 0  # byte offset in the logical file
        self._write_lock = threading.Lock()  # put, truncate, delete, recover, close
        self._flush_lock = threading.Lock()  # flush against anything that drops segments
        self._truncations = 0  # twice per truncate_past: odd while one runs
        # What delete_below last left: (the commitlog min it was given, the first
        # segment's start, how many segments). A pass given the same min over the same
        # segments has nothing to do, and does not read the entries (_cleanup_key).
        self._cleaned: tuple[int, int, int] | None = None
        self._recovered = False
        self._closed = False

    # -- published state -----------------------------------------------------------
    @property
    def name(self) -> str:
        return f"{self.topic}/{self.queue_id}"

    @property
    def min_offset(self) -> int:
        """The first queue offset a consumer can read."""
        return self._min_offset

    @property
    def max_offset(self) -> int:
        """The next queue offset to write (one past the last entry)."""
        return self._max_offset

    @property
    def max_commitlog_end(self) -> int:
        """Commitlog end offset of the last entry's record (0 when there is none)."""
        return self._max_commitlog_end

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    # -- loading and recovery --------------------------------------------------------
    def load(self) -> None:
        """Map the queue's segment files (none if its directory does not exist)."""
        with self._write_lock:
            assert not self._segments and not self._recovered, self
            if not self.directory.is_dir():
                return
            segments: list[MappedFile] = []
            try:
                for start, path in self._segment_files():
                    segments.append(MappedFile(path, start, self.segment_bytes))
            except ValueError as exc:  # MappedFile: the file has the wrong size
                for segment in segments:
                    segment.close()
                raise ConsumeQueueCorruptError(
                    f"consume queue {self.name}: {exc} ({self.entries_per_segment} entries); "
                    "was it written with another entries per segment?"
                ) from None
            for segment in segments:  # RocketMQ: every segment full until recover()
                segment.set_positions(self.segment_bytes)
            self._segments = segments

    def _segment_files(self) -> list[tuple[int, Path]]:
        found: list[tuple[int, Path]] = []
        for path in self.directory.iterdir():
            if path.name.endswith(ALLOC_SUFFIX):
                log.info("removing half-created segment %s", path)
                path.unlink()
                continue
            start = parse_segment_name(path.name)
            if start is None or not path.is_file():
                log.warning("ignoring %s: not a consume queue segment", path)
                continue
            found.append((start, path))
            if len(found) > MAX_SEGMENTS_PER_QUEUE:
                raise ConsumeQueueCorruptError(
                    f"{self.directory} holds more than {MAX_SEGMENTS_PER_QUEUE} segments"
                )
        found.sort()
        for index, (start, path) in enumerate(found):
            if start % self.segment_bytes:
                raise ConsumeQueueCorruptError(
                    f"{path}: start offset {start} is not a multiple of the segment size "
                    f"{self.segment_bytes} ({self.entries_per_segment} entries)"
                )
            if index and start != found[index - 1][0] + self.segment_bytes:
                raise ConsumeQueueCorruptError(
                    f"gap in consume queue {self.name}: {found[index - 1][1].name} "
                    f"is followed by {path.name}"
                )
        return found

    def recover(self) -> Recovered:
        """Find the end (RocketMQ's ConsumeQueue.recover) and set every position.

        Scans the last RECOVER_SEGMENTS segments for the first entry that is not written;
        zeros its segment from there and deletes the segments after it."""
        with self._write_lock, self._flush_lock:
            self._check_open()
            end = self._recover_end() if self._segments else 0
            segments = self._segments
            first = first_queue_offset(segments[0].start_offset) if segments else 0
            self._max_offset = end // ENTRY_BYTES
            first_real = self._next_real(segments, first, self._max_offset)
            self._min_offset = self._max_offset if first_real is None else first_real
            last = self._prev_real(segments, first, self._max_offset)
            self._max_commitlog_end = last.commitlog_end if last else 0
            self._flushed_where = end
            self._recovered = True
            log.info("recovered %r, commitlog end %d", self, self._max_commitlog_end)
            return Recovered(self._max_offset, self._max_commitlog_end)

    def _recover_end(self) -> int:
        segments = self._segments
        for index in range(max(0, len(segments) - RECOVER_SEGMENTS), len(segments)):
            segment = segments[index]
            position = first_unwritten(segment.read(0, segment.size_bytes)) * ENTRY_BYTES
            segment.set_positions(position)
            if position < segment.size_bytes:
                self._cut_segment(segment, position)
                self._segments = segments[: index + 1]
                self._drop_segments(segments[index + 1 :])
                return segment.start_offset + position
        return segments[-1].end_offset

    # -- writing ---------------------------------------------------------------------
    def put(self, queue_offset: int, commitlog_offset: int, size: int, tags_code: int) -> bool:
        """Write entry ``queue_offset``. False, writing nothing, if it is already there
        (a re-dispatch); ConsumeQueueConflictError if a different entry is there.
        A gap past the next offset is padded with PRE_BLANK entries."""
        check_put_args(queue_offset, commitlog_offset, size, tags_code)
        with self._write_lock:
            self._check_ready()
            if queue_offset < self._max_offset:
                self._check_redispatch(queue_offset, commitlog_offset, size)
                return False
            if commitlog_offset < self._max_commitlog_end:
                raise ConsumeQueueOrderError(
                    f"consume queue {self.name}: entry {queue_offset} points at commitlog "
                    f"offset {commitlog_offset}, inside or before the previous entry's "
                    f"record (which ends at {self._max_commitlog_end})"
                )
            pad_from = self._max_offset
            if not self._segments:  # the first segment is the one holding the entry
                pad_from = first_queue_offset(segment_start_for(queue_offset, self._eps))
            if queue_offset > pad_from:
                self._pad(pad_from, queue_offset)
            self._append(queue_offset, commitlog_offset, size, tags_code)
            self._max_commitlog_end = commitlog_offset + size
            if self._min_offset >= self._max_offset:  # no entry yet: the queue starts here
                self._min_offset = queue_offset
            self._max_offset = queue_offset + 1  # publish last
            return True

    def put_run(
        self,
        queue_offsets: Sequence[int],
        commitlog_offsets: Sequence[int],
        sizes: Sequence[int],
        tags_codes: Sequence[int],
        *,
        from_batch: bool = False,
    ) -> int:
        """:meth:`put` of many entries (in commitlog order); returns how many were
        written. The same result as one ``put`` each, in order; a run of consecutive
        queue offsets (the usual case; a ``range`` is one by construction) is checked as
        a whole and written with one ``pwrite`` per segment, anything else goes through
        ``put``. Entries a put would
        skip (already there) are checked first: on a ConsumeQueueConflictError nothing
        of the run was written; invalid arguments raise before anything is written.

        ``from_batch``: the entries are those of records of one checked commitlog batch
        (``tide.tail.RecordBatch``): each record ends at or before the next one starts,
        sizes are record sizes, tags codes 32-bit hashes; only the first and the last
        entry are checked then, else every one is.
        """
        count = len(queue_offsets)
        if not count:
            return 0
        first = queue_offsets[0]
        if not (
            len(commitlog_offsets) == len(sizes) == len(tags_codes) == count
            and queue_offsets[-1] - first == count - 1
            and (
                (isinstance(queue_offsets, range) and queue_offsets.step == 1)
                or tuple(queue_offsets) == tuple(range(first, first + count))
            )
        ):
            return sum(map(self.put, queue_offsets, commitlog_offsets, sizes, tags_codes))
        last_end = commitlog_offsets[-1] + sizes[-1]
        if from_batch:
            check_put_args(first, commitlog_offsets[0], sizes[0], tags_codes[0])
            check_put_args(first + count - 1, commitlog_offsets[-1], sizes[-1], tags_codes[-1])
            assert commitlog_offsets[0] <= commitlog_offsets[-1], "a run goes back"
            return self._put_run(first, commitlog_offsets, sizes, tags_codes, last_end)
        check_put_args(first + count - 1, commitlog_offsets[0], min(sizes), min(tags_codes))
        check_put_args(first, commitlog_offsets[-1], max(sizes), max(tags_codes))
        if count > 1 and not all(
            map(le, map(add, commitlog_offsets, sizes), commitlog_offsets[1:])
        ):
            raise ConsumeQueueOrderError(
                f"consume queue {self.name}: the entries of a run overlap or go back in "
                "the commitlog"
            )
        return self._put_run(first, commitlog_offsets, sizes, tags_codes, last_end)

    def put_entries_run(self, first: int, entries: bytes) -> int:
        """:meth:`put_run` (``from_batch``) of the consecutive queue offsets from
        ``first``, the run's entries given as their bytes (``pack_entries``; what
        ``tide.format.queue_entry_runs`` answers for a batch's queue): the same checks,
        result and bytes written, without the run's three columns as lists."""
        count, rest = divmod(len(entries), ENTRY_BYTES)
        if rest:
            raise ValueError(f"{len(entries)} bytes of entries: not whole entries")
        if not count:
            return 0
        head = unpack_entry(entries)
        tail = unpack_entry(entries, len(entries) - ENTRY_BYTES)
        check_put_args(first, *head)
        check_put_args(first + count - 1, *tail)
        assert head.commitlog_offset <= tail.commitlog_offset, "a run goes back"
        last_end = tail.commitlog_offset + tail.size
        with self._write_lock:
            self._check_ready()
            skip = min(count, max(0, self._max_offset - first))
            for index in range(skip):  # a re-dispatch: what is there must be the same
                old = unpack_entry(entries, index * ENTRY_BYTES)
                self._check_redispatch(first + index, old.commitlog_offset, old.size)
            if skip == count:
                return 0
            self._write_run_locked(
                first, skip, count, unpack_entry(entries, skip * ENTRY_BYTES).commitlog_offset
            )
            self._append_entries(first + skip, entries[skip * ENTRY_BYTES :])
            self._publish_run_locked(first, skip, count, last_end)
            return count - skip

    def _put_run(
        self,
        first: int,
        commitlog_offsets: Sequence[int],
        sizes: Sequence[int],
        tags_codes: Sequence[int],
        last_end: int,
    ) -> int:
        count = len(commitlog_offsets)
        with self._write_lock:
            self._check_ready()
            skip = min(count, max(0, self._max_offset - first))
            if skip:  # a re-dispatch: what is there must be the same
                for index in range(skip):
                    self._check_redispatch(first + index, commitlog_offsets[index], sizes[index])
                if skip == count:
                    return 0
            self._write_run_locked(first, skip, count, commitlog_offsets[skip])
            self._append_entries(
                first + skip,
                pack_entries(commitlog_offsets[skip:], sizes[skip:], tags_codes[skip:]),
            )
            self._publish_run_locked(first, skip, count, last_end)
            return count - skip

    def _write_run_locked(self, first: int, skip: int, count: int, first_offset: int) -> None:
        """Before a run's entries from ``first + skip`` are written (the write lock
        held): they go after the last entry's record; the gap before them padded."""
        start = first + skip
        if first_offset < self._max_commitlog_end:
            raise ConsumeQueueOrderError(
                f"consume queue {self.name}: entry {start} points at commitlog "
                f"offset {first_offset}, inside or before the previous "
                f"entry's record (which ends at {self._max_commitlog_end})"
            )
        pad_from = self._max_offset
        if not self._segments:
            pad_from = first_queue_offset(segment_start_for(start, self._eps))
        if start > pad_from:
            self._pad(pad_from, start)

    def _publish_run_locked(self, first: int, skip: int, count: int, last_end: int) -> None:
        self._max_commitlog_end = last_end
        if self._min_offset >= self._max_offset:
            self._min_offset = first + skip
        self._max_offset = first + count  # publish last

    def _append_entries(self, queue_offset: int, data: bytes) -> None:
        """Write entries' bytes from ``queue_offset`` on, one ``pwrite`` per segment."""
        # Every segment the run needs first: a full disk fails here, before any entry is
        # written (a run cut short by it would be found again by a retry's zero check).
        last = queue_offset + len(data) // ENTRY_BYTES - 1
        for start in range(
            segment_start_for(queue_offset, self._eps),
            segment_start_for(last, self._eps) + 1,
            self.segment_bytes,
        ):
            self._segment_for_write(first_queue_offset(start))
        done = 0
        while done < len(data):
            segment = self._segment_for_write(queue_offset)
            position = position_in_segment(queue_offset, self._eps)
            take = min(len(data) - done, segment.size_bytes - position)
            end = position + take
            assert _lands_on_zeros(segment, position, end), (self, queue_offset)
            _write_at(segment, position, data, done, take)
            segment.wrote = segment.committed = end
            done += take
            queue_offset += take // ENTRY_BYTES

    @property
    def _eps(self) -> int:
        return self.entries_per_segment

    def _check_redispatch(self, queue_offset: int, commitlog_offset: int, size: int) -> None:
        data = self._read_run(self._segments, queue_offset, 1)
        if data is None:
            log.debug("%s: re-put of %d, whose segment is deleted", self.name, queue_offset)
            return
        old = unpack_entry(data)
        if (old.commitlog_offset, old.size) != (commitlog_offset, size):
            raise ConsumeQueueConflictError(
                f"consume queue {self.name}: offset {queue_offset} holds commitlog offset "
                f"{old.commitlog_offset} size {old.size}; the new entry says commitlog "
                f"offset {commitlog_offset} size {size}"
            )

    def _pad(self, pad_from: int, queue_offset: int) -> None:
        """PRE_BLANK entries over ``[pad_from, queue_offset)`` (RocketMQ's fillPreBlank)."""
        segments = self._segments
        next_start = segments[-1].end_offset if segments else segment_start_for(pad_from, self._eps)
        new_segments = (
            segment_start_for(queue_offset, self._eps) - next_start
        ) // self.segment_bytes
        if new_segments + 1 > MAX_PAD_SEGMENTS:
            raise ConsumeQueueOrderError(
                f"consume queue {self.name}: offset {queue_offset} is "
                f"{queue_offset - self._max_offset} past the next offset {self._max_offset}; "
                f"padding the gap would create {new_segments + 1} segments "
                f"(limit {MAX_PAD_SEGMENTS})"
            )
        if segments:
            log.warning("%r: PRE_BLANK for missing %d..%d", self, pad_from, queue_offset - 1)
        offset = pad_from
        while offset < queue_offset:
            segment = self._segment_for_write(offset)
            count = min(queue_offset, first_queue_offset(segment.end_offset)) - offset
            position = position_in_segment(offset, self._eps)
            end = position + count * ENTRY_BYTES
            for pos in range(position, end, _WRITE_CHUNK_BYTES):
                chunk = min(_WRITE_CHUNK_BYTES, end - pos)
                segment.mm[pos : pos + chunk] = _PRE_BLANK_CHUNK[:chunk]
            segment.wrote = segment.committed = end
            offset += count

    def _append(self, queue_offset: int, commitlog_offset: int, size: int, tags_code: int) -> None:
        segment = self._segment_for_write(queue_offset)
        position = position_in_segment(queue_offset, self._eps)
        assert segment.mm[position : position + ENTRY_BYTES] == _ZERO_ENTRY, (self, queue_offset)
        pack_entry_into(segment.mm, position, commitlog_offset, size, tags_code)
        segment.wrote = segment.committed = position + ENTRY_BYTES

    def _segment_for_write(self, queue_offset: int) -> MappedFile:
        start = segment_start_for(queue_offset, self._eps)
        segments = self._segments
        segment = self._locate(segments, start)
        if segment is not None:
            return segment
        assert not segments or segments[-1].end_offset == start, (self, queue_offset)
        return self._create_segment(start)

    def _create_segment(self, start: int) -> MappedFile:
        if len(self._segments) >= MAX_SEGMENTS_PER_QUEUE:
            raise ConsumeQueueOrderError(
                f"consume queue {self.name} has {MAX_SEGMENTS_PER_QUEUE} segments, the limit"
            )
        make_dirs(self.directory)
        path = self.directory / segment_name(start)
        if path.exists():
            raise ConsumeQueueCorruptError(f"{path} exists but is not part of the queue")
        tmp = path.with_name(path.name + ALLOC_SUFFIX)
        allocate_file(tmp, self.segment_bytes)  # a full disk fails here, cheaply
        try:
            os.rename(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        try:
            fsync_dir(self.directory)
            segment = MappedFile(path, start, self.segment_bytes)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        self._segments = [*self._segments, segment]
        return segment

    # -- truncation and retention ----------------------------------------------------
    def truncate_past(self, commitlog_offset: int) -> int:
        """Drop the entries pointing at or past ``commitlog_offset`` (the commitlog was cut
        there); zero them on disk, delete segments left empty. Returns entries dropped."""
        if commitlog_offset < 0:
            raise ValueError(f"commitlog offset {commitlog_offset} is negative")
        with self._write_lock, self._flush_lock:
            self._check_ready()
            segments = self._segments
            if not segments:
                return 0
            first = first_queue_offset(segments[0].start_offset)
            old_max = self._max_offset
            cut = self._search_first(
                segments, first, old_max, lambda e: e.commitlog_offset >= commitlog_offset
            )
            if cut is None:
                return 0
            self._truncations += 1  # odd: readers retry
            self._cleaned = None  # the min may have moved back: the next pass looks again
            try:
                self._drop_past(segments, first, cut)
            finally:
                self._truncations += 1
            log.warning("%r: dropped %d..%d (>= %d)", self, cut, old_max - 1, commitlog_offset)
            return old_max - cut

    def _drop_past(self, segments: list[MappedFile], first: int, cut: int) -> None:
        end = logical_position(cut)
        keep = [s for s in segments if s.start_offset < end]
        self._max_offset = cut
        self._min_offset = min(self._min_offset, cut)
        self._segments = keep
        if keep and end < keep[-1].end_offset:
            self._cut_segment(keep[-1], end - keep[-1].start_offset)
        self._drop_segments(segments[len(keep) :])
        self._flushed_where = min(self._flushed_where, end)
        last = self._prev_real(keep, first, cut)
        self._max_commitlog_end = last.commitlog_end if last else 0

    def delete_below(self, commitlog_min_offset: int) -> int:
        """Delete the segments whose last entry points below the commitlog's minimum
        offset (never the last segment); move ``min_offset`` to the first entry pointing
        at or past it (RocketMQ's deleteExpiredFile + correctMinOffset). Returns the
        number of segments deleted."""
        with self._write_lock, self._flush_lock:
            self._check_ready()
            segments = self._segments
            if self._cleaned == _cleanup_key(commitlog_min_offset, segments):
                # Nothing fell below the min since the last pass (entries only ever point
                # past it; a new segment changes the key): the entries the pass would read
                # are the first segment's last and a search's, every pass, cold or not.
                return 0
            count = 0
            while count < len(segments) - 1:
                last = self._read_run(
                    segments, first_queue_offset(segments[count].end_offset) - 1, 1
                )
                assert last is not None, (self, count)
                if unpack_entry(last).commitlog_offset >= commitlog_min_offset:
                    break
                count += 1
            # The min moves first, then the segments go: a reader that sees the shorter
            # list also sees the new min, so the min reported (GetQueueOffsets) is always
            # an entry a read (GetQueueEntries) finds.
            self._correct_min_offset(segments[count:], commitlog_min_offset)
            if count:
                self._segments = segments[count:]
                self._drop_segments(segments[:count])
            self._cleaned = _cleanup_key(commitlog_min_offset, self._segments)
            return count

    def _correct_min_offset(self, segments: list[MappedFile], commitlog_min_offset: int) -> None:
        """Move ``min_offset`` to the first entry of ``segments`` (the ones kept) pointing
        at or past ``commitlog_min_offset``; never backwards."""
        if not segments:
            return
        start = max(self._min_offset, first_queue_offset(segments[0].start_offset))
        found = self._search_first(
            segments, start, self._max_offset, lambda e: e.commitlog_offset >= commitlog_min_offset
        )
        new_min = self._max_offset if found is None else found
        if new_min > self._min_offset:
            log.info("consume queue %s: min offset %d -> %d", self.name, self._min_offset, new_min)
            self._min_offset = new_min

    def _cut_segment(self, segment: MappedFile, position: int) -> None:
        """Zero ``segment`` from ``position`` durably; set its positions there."""
        segment.set_positions(position)
        zeroed = segment.zero_from(position)
        if zeroed:
            log.warning(
                "%s: zeroed %d bytes of %s at %d", self.name, zeroed, segment.path, position
            )
            segment.sync()

    def _drop_segments(self, segments: list[MappedFile]) -> None:
        """Delete segments already taken out of the list; waits for readers' holds."""
        for segment in segments:
            log.info("consume queue %s: deleting segment %s", self.name, segment.path.name)
            while not segment.try_destroy(DESTROY_FORCE_MS):
                time.sleep(0.001)
        if segments:
            fsync_dir(self.directory)

    # -- flush and close -------------------------------------------------------------
    def flush(self, least_pages: int) -> bool:
        """fdatasync what is written, from the first segment not flushed to its end: a
        segment that is not full only with ``least_pages`` dirty pages (0: any); a full
        one always. True if anything was synced."""
        if least_pages < 0:
            raise ValueError(f"least pages {least_pages} is negative")
        with self._flush_lock:
            segments = self._segments
            if self._closed or not segments:
                return False
            index = max(0, (self._flushed_where - segments[0].start_offset) // self.segment_bytes)
            did = False
            for segment in segments[index:]:
                full = segment.committed == segment.size_bytes
                did = segment.flush(0 if full else least_pages) or did
                self._flushed_where = segment.start_offset + segment.flushed
                if segment.flushed < segment.size_bytes:
                    break
            return did

    def close(self) -> None:
        """Unmap the segments (no flush: call flush(0) first for a clean shutdown)."""
        with self._write_lock, self._flush_lock:
            if self._closed:
                return
            self._closed = True
            segments, self._segments = self._segments, []
            for segment in segments:
                segment.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumeQueueError(f"consume queue {self.name} is closed")

    def _check_ready(self) -> None:
        self._check_open()
        if not self._recovered:
            raise ConsumeQueueError(f"consume queue {self.name}: call load() and recover() first")

    # -- reading ---------------------------------------------------------------------
    def get(self, queue_offset: int, max_count: int) -> list[Entry]:
        """Up to ``max_count`` entries from ``queue_offset`` within ``[min_offset,
        max_offset)`` as captured at the call; PRE_BLANK entries included (is_pre_blank).
        Empty while a truncation runs."""
        return self._read_retried(queue_offset, max_count, self._get)

    def get_bytes(self, queue_offset: int, max_count: int) -> bytes:
        """:meth:`get`'s entries as their bytes (``ENTRY_BYTES`` each, the one at byte
        ``i * ENTRY_BYTES`` is queue offset ``queue_offset + i``), the runs of two
        segments joined; empty when get's list is.

        For the hot read path (GetQueueEntries' spans: every pull): no object per entry,
        ``tide.format.select_spans`` reads them in the compiled core."""
        runs: list[bytes] = self._read_retried(queue_offset, max_count, self._get_runs)
        return b"".join(runs)

    def resident(self, queue_offset: int, count: int) -> bool:
        """Whether the bytes of the ``count`` entries from ``queue_offset`` are all in memory
        (``MappedFile.resident``: mincore), so that reading them from the mappings takes
        no disk read; True for what is not in a segment (nothing to fetch from the disk:
        the read itself answers that)."""
        segments = self._segments
        offset, end = queue_offset, queue_offset + count
        while offset < end:
            segment = self._locate(segments, logical_position(offset))
            if segment is None:
                return True
            position = position_in_segment(offset, self._eps)
            run = min(end - offset, (segment.size_bytes - position) // ENTRY_BYTES)
            if not segment.resident(position, run * ENTRY_BYTES):
                return False
            offset += run
        return True

    def _read_retried(
        self, queue_offset: int, max_count: int, read: Callable[[int, int], list[_T]]
    ) -> list[_T]:
        """``read(queue_offset, max_count)``, retried while a truncation overlaps it;
        empty if one overlaps every attempt (get's contract)."""
        if not 1 <= max_count <= MAX_GET_ENTRIES:
            raise ValueError(f"max count {max_count} is outside 1..{MAX_GET_ENTRIES}")
        for _ in range(_READ_ATTEMPTS):
            try:
                return self._consistent(lambda: read(queue_offset, max_count))
            except ConsumeQueueChangedError:
                continue
        return []

    def _get(self, queue_offset: int, max_count: int) -> list[Entry]:
        entries: list[Entry] = []
        for offset, data in self._written_runs(queue_offset, max_count):
            entries += [Entry(n, *unit) for n, unit in enumerate(iter_entries(data), offset)]
        return entries

    def _get_runs(self, queue_offset: int, max_count: int) -> list[bytes]:
        return [data for _, data in self._written_runs(queue_offset, max_count)]

    def _written_runs(self, queue_offset: int, max_count: int) -> Iterator[tuple[int, bytes]]:
        """The bytes of get's entries, one run per segment, each with the queue offset of
        its first entry; they end before the first entry RocketMQ does not count as
        written (:func:`tide.format.first_unwritten`: one pass over a run in C, so that a read
        racing a truncation that zeroed entries under it stops there) or at a segment
        retention deleted meanwhile. Consume it inside ``_consistent``."""
        end = self._max_offset  # captured before the segment list
        segments = self._segments
        if not self._min_offset <= queue_offset < end:
            return
        end = min(end, queue_offset + max_count)
        offset = queue_offset
        while offset < end:
            data = self._read_run(segments, offset, end - offset)
            if data is None:  # deleted by retention meanwhile
                return
            count = len(data) // ENTRY_BYTES
            written = first_unwritten(data)
            if written < count:
                if written:
                    yield offset, data[: written * ENTRY_BYTES]
                return
            yield offset, data
            offset += count

    def entry_at(self, queue_offset: int) -> Entry | None:
        """The entry at ``queue_offset`` if it is within ``[min_offset, max_offset)``."""
        entries = self.get(queue_offset, 1)
        return entries[0] if entries else None

    def last_entry(self) -> Entry | None:
        """The last entry that is not a PRE_BLANK, within ``[min_offset, max_offset)``.
        ConsumeQueueChangedError if a truncation or deletion ran meanwhile."""

        def read() -> Entry | None:
            end = self._max_offset
            return self._prev_real(self._segments, self._min_offset, end)

        return self._consistent(read)

    def search_first(self, predicate: Callable[[Entry], bool]) -> int | None:
        """Queue offset of the first entry (PRE_BLANKs skipped) in ``[min_offset,
        max_offset)`` for which ``predicate`` holds, which must be False...True in queue
        order (e.g. store timestamp >= t); None if there is none. Binary search.
        ConsumeQueueChangedError if a truncation or deletion ran meanwhile."""

        def read() -> int | None:
            end = self._max_offset
            return self._search_first(self._segments, self._min_offset, end, predicate)

        return self._consistent(read)

    def _consistent(self, read: Callable[[], _T]) -> _T:
        """``read()`` if no truncation overlapped it (a sequence lock: truncate_past makes
        ``_truncations`` odd while it zeros entries), else ConsumeQueueChangedError."""
        before = self._truncations
        if before % 2 == 0:
            result = read()
            if self._truncations == before:
                return result
        raise ConsumeQueueChangedError(f"consume queue {self.name} was truncated meanwhile; retry")

    def _search_first(
        self, segments: list[MappedFile], lo: int, hi: int, predicate: Callable[[Entry], bool]
    ) -> int | None:
        found: int | None = None  # the answer, unless one lies in [lo, hi)
        while lo < hi:
            mid = (lo + hi) // 2
            real = self._next_real(segments, mid, hi)
            if real is None:  # [mid, hi) is all PRE_BLANK
                hi = mid
                continue
            if predicate(self._entry(segments, real)):
                found, hi = real, mid  # [mid, real) is PRE_BLANK
            else:
                lo = real + 1
        return found

    def _next_real(self, segments: list[MappedFile], offset: int, end: int) -> int | None:
        """The first queue offset in ``[offset, end)`` not holding a PRE_BLANK, or None."""
        while offset < end:
            data = self._read_run(segments, offset, min(end - offset, _SCAN_CHUNK_ENTRIES))
            if data is None:
                raise self._changed(offset)
            if data != _PRE_BLANK_CHUNK[: len(data)]:
                for index in range(len(data) // ENTRY_BYTES):
                    pos = index * ENTRY_BYTES
                    if data[pos : pos + ENTRY_BYTES] != PRE_BLANK_ENTRY:
                        return offset + index
            offset += len(data) // ENTRY_BYTES
        return None

    def _prev_real(self, segments: list[MappedFile], begin: int, end: int) -> Entry | None:
        """The last entry in ``[begin, end)`` that is not a PRE_BLANK, or None."""
        while end > begin:
            segment_first = first_queue_offset(segment_start_for(end - 1, self._eps))
            start = max(begin, end - _SCAN_CHUNK_ENTRIES, segment_first)
            data = self._read_run(segments, start, end - start)
            if data is None:
                raise self._changed(start)
            assert len(data) == (end - start) * ENTRY_BYTES, (self, start, end)
            if data != _PRE_BLANK_CHUNK[: len(data)]:
                for index in reversed(range(end - start)):
                    pos = index * ENTRY_BYTES
                    if data[pos : pos + ENTRY_BYTES] != PRE_BLANK_ENTRY:
                        return Entry(start + index, *unpack_entry(data, pos))
            end = start
        return None

    def _entry(self, segments: list[MappedFile], queue_offset: int) -> Entry:
        data = self._read_run(segments, queue_offset, 1)
        if data is None:
            raise self._changed(queue_offset)
        return Entry(queue_offset, *unpack_entry(data))

    def _read_run(self, segments: list[MappedFile], queue_offset: int, count: int) -> bytes | None:
        """Up to ``count`` entries' bytes from ``queue_offset``, within its segment; None
        if that segment is not in ``segments`` or is being deleted."""
        segment = self._locate(segments, logical_position(queue_offset))
        if segment is None or not segment.hold():
            return None
        try:
            position = position_in_segment(queue_offset, self._eps)
            count = min(count, (segment.size_bytes - position) // ENTRY_BYTES)
            return segment.read(position, count * ENTRY_BYTES)
        finally:
            segment.release()

    def _locate(self, segments: list[MappedFile], byte_offset: int) -> MappedFile | None:
        if not segments:
            return None
        index = (byte_offset - segments[0].start_offset) // self.segment_bytes
        if not 0 <= index < len(segments):
            return None
        segment = segments[index]
        assert segment.start_offset <= byte_offset < segment.end_offset, (segment, byte_offset)
        return segment

    def _changed(self, queue_offset: int) -> ConsumeQueueChangedError:
        return ConsumeQueueChangedError(
            f"consume queue {self.name}: the segment holding offset {queue_offset} was "
            "deleted meanwhile; retry"
        )

    def __repr__(self) -> str:
        return (
            f"ConsumeQueue({self.name}, offsets {self._min_offset}..{self._max_offset}, "
            f"{len(self._segments)} segment(s))"
        )

"""Iterate over the records of a commitlog directory, offline and read-only."""

from __future__ import annotations

import mmap
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tide.commitlog._layout import CommitlogLayoutError, SegmentFile, open_segments
from tide.commitlog._mapped import TornTail, classify_stop, map_segment
from tide.format import (
    DecodedRecord,
    RecordError,
    ScanKind,
    TailMarks,
    decode_record,
    scan_record,
)


@dataclass(frozen=True, slots=True)
class RecordAt:
    """A decoded record and its position in the commitlog."""

    offset: int
    record: DecodedRecord

    @property
    def end_offset(self) -> int:
        return self.offset + self.record.total_size


class CommitlogCorruptionError(ValueError):
    """Invalid bytes followed by valid data."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"corruption at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


# What a walk through one segment ends with: the next segment index, or None to stop.
_Next = int | None


def iter_records(
    commitlog_dir: Path,
    start_offset: int | None = None,
    check_crc: bool = True,
    on_torn_tail: Callable[[TornTail], None] | None = None,
    marks: TailMarks | None = None,
) -> Generator[RecordAt, None, None]:
    """Yield every record from ``start_offset`` on (default: the oldest one).

    Follows blank markers to the next segment and stops at the end of the data (zeros).
    A ``start_offset`` inside a record starts at the next record; one below the oldest
    segment starts at the oldest record. Stops at a torn tail (reported to
    ``on_torn_tail``) and raises :class:`CommitlogCorruptionError` on corruption or
    :class:`CommitlogLayoutError` on a broken segment chain. ``marks`` (from the store
    root, ``tide.format.read_tail_marks``) tell a crash's interrupted write from
    corruption; without them, invalid bytes followed by valid data are corruption.
    """
    marks = marks if marks is not None else TailMarks()
    segments = open_segments(commitlog_dir)
    index, skip_below = _start_position(segments, start_offset)
    next_index: _Next = index
    while next_index is not None and next_index < len(segments):
        segment = segments[next_index]
        with map_segment(segment) as mm:
            walk = _SegmentWalk(segments, next_index, mm, check_crc, on_torn_tail, marks)
            next_index = yield from walk.records(skip_below if next_index == index else 0)


def _start_position(segments: Sequence[SegmentFile], start_offset: int | None) -> tuple[int, int]:
    """(segment index, position below which records are skipped) for ``start_offset``."""
    if start_offset is None or not segments or start_offset <= segments[0].start_offset:
        return 0, 0
    first = segments[0]
    index = (start_offset - first.start_offset) // first.size
    if index >= len(segments):
        return len(segments), 0
    return index, start_offset - segments[index].start_offset


class _SegmentWalk:
    def __init__(
        self,
        segments: Sequence[SegmentFile],
        index: int,
        mm: mmap.mmap,
        check_crc: bool,
        on_torn_tail: Callable[[TornTail], None] | None,
        marks: TailMarks,
    ) -> None:
        self.segments = segments
        self.index = index
        self.segment = segments[index]
        self.mm = mm
        self.check_crc = check_crc
        self.on_torn_tail = on_torn_tail
        self.marks = marks

    def records(self, skip_below: int) -> Generator[RecordAt, None, _Next]:
        pos = self._first_position(skip_below)
        base, size = self.segment.start_offset, self.segment.size
        while True:
            # Records skipped below the start offset are only walked over: no CRC.
            check_crc = self.check_crc and pos >= skip_below
            scan = scan_record(self.mm, pos, size, expected_offset=base + pos, check_crc=check_crc)
            if scan.kind is ScanKind.RECORD:
                if pos >= skip_below:
                    yield RecordAt(base + pos, self._decode(pos))
                pos += scan.size
            elif scan.kind is ScanKind.BLANK or pos >= size:
                return self.index + 1
            elif scan.kind is ScanKind.END:
                return self._problem(pos, f"no data at offset {base + pos} (zeros)")
            else:
                return self._problem(pos, scan.reason)

    def _first_position(self, skip_below: int) -> int:
        """``skip_below`` itself when a record starts there, else the segment start."""
        if skip_below == 0:
            return 0
        expected = self.segment.start_offset + skip_below
        scan = scan_record(self.mm, skip_below, self.segment.size, expected_offset=expected)
        return skip_below if scan.kind is ScanKind.RECORD else 0

    def _decode(self, pos: int) -> DecodedRecord:
        # Already scanned (CRC included when asked): skip the second CRC pass.
        return decode_record(self.mm, pos, self.segment.size, check_crc=False)

    def _problem(self, pos: int, reason: str) -> _Next:
        stop = classify_stop(self.segments, self.index, self.mm, pos, reason, self.marks)
        if stop.corruption is not None:
            raise CommitlogCorruptionError(self.segment.start_offset + pos, stop.corruption)
        if stop.torn is not None and self.on_torn_tail is not None:
            self.on_torn_tail(stop.torn)
        return None


def first_store_timestamp_ms(segment: SegmentFile) -> int | None:
    """The store time of the segment's first record (one record read), None when it
    holds none (empty, or not a record where one starts)."""
    try:
        with map_segment(segment) as mm:
            return decode_record(mm, 0, len(mm), check_crc=False).store_timestamp_ms
    except (RecordError, CommitlogLayoutError, OSError):
        return None

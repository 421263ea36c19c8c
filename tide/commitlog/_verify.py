"""Check every record of a commitlog directory, telling a torn tail from corruption."""

from __future__ import annotations

import mmap
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tide.commitlog._layout import CommitlogLayout, scan_layout
from tide.commitlog._mapped import TornTail, classify_stop, map_segment
from tide.format import ScanKind, TailMarks, scan_record

MAX_FINDINGS = 1000
PROGRESS_STEP_BYTES = 1 << 20

# progress(bytes_done, bytes_total)
ProgressFn = Callable[[int, int], None]
# (segment index, position inside the segment)
_Position = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Finding:
    offset: int
    reason: str


@dataclass(slots=True)
class VerifyReport:
    """What :func:`verify` found. ``last_valid_offset`` ends the intact prefix of the log:
    the end of the last valid record before the first problem (torn tail or corruption).
    """

    commitlog_dir: str
    segment_size: int = 0
    segments_checked: int = 0
    records: int = 0
    record_bytes: int = 0
    blank_markers: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    last_valid_offset: int = 0
    torn_tail: TornTail | None = None
    corruption: list[Finding] = field(default_factory=list)
    corruption_count: int = 0
    warnings: list[str] = field(default_factory=list)
    # What the store root said about the tail (abort file, durable offset).
    tail_marks: TailMarks = field(default_factory=TailMarks)

    @property
    def valid(self) -> bool:
        """No corruption (a torn tail is a clean end after a crash)."""
        return self.corruption_count == 0

    @property
    def empty(self) -> bool:
        """No segment at all: a store nothing was ever written to (valid, and said so)."""
        return self.segments_checked == 0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["valid"] = self.valid
        data["empty"] = self.empty
        data["corruption_truncated"] = self.corruption_count > len(self.corruption)
        return data


def verify(
    commitlog_dir: Path, progress: ProgressFn | None = None, marks: TailMarks | None = None
) -> VerifyReport:
    """Check the segment chain and every record; raise CommitlogLayoutError on a bad chain.

    ``marks`` (from the store root, ``tide.format.read_tail_marks``) tell a crash's
    interrupted write from corruption; without them, invalid bytes followed by valid
    data are corruption.
    """
    layout = scan_layout(commitlog_dir)
    checker = _Verifier(layout, progress, marks if marks is not None else TailMarks())
    checker.run()
    return checker.report


class _Verifier:
    def __init__(
        self, layout: CommitlogLayout, progress: ProgressFn | None, marks: TailMarks
    ) -> None:
        self.segments = layout.segments
        self.marks = marks
        self.total = layout.total_bytes
        self.progress = progress
        self.reported = 0
        first = self.segments[0].start_offset if self.segments else 0
        self.base = first
        self.report = VerifyReport(
            commitlog_dir=str(layout.directory),
            segment_size=layout.segment_size,
            segments_checked=len(self.segments),
            last_valid_offset=first,
            warnings=list(layout.warnings),
            tail_marks=marks,
        )
        self.intact = True  # no problem seen yet: last_valid_offset still moves

    def run(self) -> None:
        position: _Position | None = (0, 0)
        while position is not None and position[0] < len(self.segments):
            index, pos = position
            with map_segment(self.segments[index]) as mm:
                position = self._check_segment(index, mm, pos)
        self._tick(self.total, force=True)

    def _check_segment(self, index: int, mm: mmap.mmap, pos: int) -> _Position | None:
        """Walk one segment; return where to go on, or None at the end of the data."""
        segment = self.segments[index]
        while True:
            offset = segment.start_offset + pos
            self._tick(offset - self.base)
            scan = scan_record(mm, pos, segment.size, expected_offset=offset)
            if scan.kind is ScanKind.RECORD:
                self._record(offset, scan.size)
                pos += scan.size
            elif scan.kind is ScanKind.BLANK:
                self.report.blank_markers += 1
                return index + 1, 0
            elif pos >= segment.size:
                name = segment.path.name
                self.report.warnings.append(f"segment {name} is full without a blank marker")
                return index + 1, 0
            else:  # END (zeros) or INVALID
                reason = scan.reason or f"no data at offset {offset} (zeros)"
                where = self._problem(index, mm, pos, reason)
                if where is None or where[0] != index:
                    return where
                pos = where[1]

    def _problem(self, index: int, mm: mmap.mmap, pos: int, reason: str) -> _Position | None:
        """No record at ``pos``: the end of the data, a torn tail, or corruption."""
        stop = classify_stop(self.segments, index, mm, pos, reason, self.marks)
        if stop.corruption is not None:
            self._corruption(self.segments[index].start_offset + pos, stop.corruption)
            return None if stop.resume is None else (stop.resume.segment_index, stop.resume.pos)
        if stop.torn is not None:
            self.report.torn_tail = stop.torn
            self.intact = False
        return None

    def _record(self, offset: int, size: int) -> None:
        report = self.report
        report.records += 1
        report.record_bytes += size
        if report.first_offset is None:
            report.first_offset = offset
        report.last_offset = offset
        if self.intact:
            report.last_valid_offset = offset + size

    def _corruption(self, offset: int, reason: str) -> None:
        self.intact = False
        self.report.corruption_count += 1
        if len(self.report.corruption) < MAX_FINDINGS:
            self.report.corruption.append(Finding(offset, reason))

    def _tick(self, done: int, *, force: bool = False) -> None:
        if self.progress is None:
            return
        if force or done - self.reported >= PROGRESS_STEP_BYTES:
            self.reported = done
            self.progress(done, self.total)

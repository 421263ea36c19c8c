"""The segment files of a commitlog directory, and the rules their chain must follow.

Segments are named by their 20-digit start offset; every segment has the same size
(the file size) and each one starts where the previous one ends (docs/formats.md,
"Store root layout"). Anything else in the directory is reported as a warning.
"""

from __future__ import annotations

import itertools
import logging
import stat
from dataclasses import dataclass
from pathlib import Path

from tide.format import TailMarks, parse_segment_name, read_tail_marks, segment_name

log = logging.getLogger(__name__)

COMMITLOG_DIR_NAME = "commitlog"
# Limits: a directory this large is not a commitlog (1 GiB segments: one million = 1 PiB).
MAX_DIR_ENTRIES = 1_000_000
MAX_WARNINGS = 100


class CommitlogLayoutError(ValueError):
    """The commitlog directory's segment files do not form a valid chain."""


class NotAStoreError(CommitlogLayoutError):
    """The directory is neither a store root (holding ``commitlog/``) nor a commitlog
    directory: offline tools refuse it rather than report an empty, valid log."""


@dataclass(frozen=True, slots=True)
class SegmentFile:
    path: Path
    start_offset: int
    size: int

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size


@dataclass(frozen=True, slots=True)
class CommitlogLayout:
    directory: Path
    segments: tuple[SegmentFile, ...]
    warnings: tuple[str, ...]

    @property
    def segment_size(self) -> int:
        return self.segments[0].size if self.segments else 0

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.segments)


def find_commitlog_dir(path: Path) -> Path:
    """The commitlog directory ``path`` names: ``path/commitlog`` for a store root, else
    ``path`` itself when it is a commitlog directory (named ``commitlog``, or holding a
    segment file, as a copy elsewhere does). Anything else raises :class:`NotAStoreError`:
    an empty directory or ``/etc`` is not a store, and a tool that said "valid, no
    records" for it would hide a wrong path."""
    if not path.is_dir():
        raise NotAStoreError(f"{path}: not a directory")
    candidate = path / COMMITLOG_DIR_NAME
    if candidate.is_dir():
        return candidate
    if path.name == COMMITLOG_DIR_NAME or _holds_a_segment(path):
        return path
    raise NotAStoreError(
        f"{path} is not a Tide/RocketMQ store: no {COMMITLOG_DIR_NAME}/ directory (expected "
        f"a store root holding {COMMITLOG_DIR_NAME}/, or a commitlog directory of segment "
        "files named by their 20-digit start offset)"
    )


def _holds_a_segment(directory: Path) -> bool:
    # Bounded like scan_layout: a huge directory is not a commitlog.
    try:
        entries = itertools.islice(directory.iterdir(), MAX_DIR_ENTRIES)
        return any(parse_segment_name(entry.name) is not None for entry in entries)
    except OSError as exc:  # unreadable: say so rather than fail with a traceback
        raise NotAStoreError(f"{directory}: cannot list it: {exc.strerror}") from exc


def tail_marks_for(commitlog_dir: Path) -> TailMarks:
    """What the store root around ``commitlog_dir`` says about the log's tail (its abort
    file and queue offset snapshot); nothing for a directory outside a store root."""
    if commitlog_dir.name != COMMITLOG_DIR_NAME:
        return TailMarks()
    return read_tail_marks(commitlog_dir.parent)


def scan_layout(commitlog_dir: Path) -> CommitlogLayout:
    """List and check the segment files; raise :class:`CommitlogLayoutError` if broken."""
    if not commitlog_dir.is_dir():
        raise CommitlogLayoutError(f"{commitlog_dir} is not a directory")
    segments: list[SegmentFile] = []
    warnings: list[str] = []
    for count, entry in enumerate(sorted(commitlog_dir.iterdir()), start=1):
        if count > MAX_DIR_ENTRIES:
            raise CommitlogLayoutError(
                f"{commitlog_dir} holds more than {MAX_DIR_ENTRIES} entries: not a commitlog"
            )
        segment = _segment_of(entry, warnings)
        if segment is not None:
            segments.append(segment)
    segments.sort(key=lambda s: s.start_offset)
    _check_chain(segments)
    if len(warnings) > MAX_WARNINGS:
        warnings[MAX_WARNINGS:] = [f"... and {len(warnings) - MAX_WARNINGS} more stray files"]
    return CommitlogLayout(commitlog_dir, tuple(segments), tuple(warnings))


def open_segments(commitlog_dir: Path) -> list[SegmentFile]:
    """The checked chain of segments (oldest first); stray files are logged as warnings."""
    layout = scan_layout(commitlog_dir)
    for warning in layout.warnings:
        log.warning("%s", warning)
    return list(layout.segments)


def _segment_of(entry: Path, warnings: list[str]) -> SegmentFile | None:
    start = parse_segment_name(entry.name)
    if start is None:
        warnings.append(f"ignoring {entry.name!r}: not a segment file")
        return None
    info = entry.stat()
    if not stat.S_ISREG(info.st_mode):
        raise CommitlogLayoutError(f"{entry} is named like a segment but is not a regular file")
    if info.st_size == 0:
        raise CommitlogLayoutError(f"segment {entry} is empty (0 bytes)")
    return SegmentFile(entry, start, info.st_size)


def _check_chain(segments: list[SegmentFile]) -> None:
    if not segments:
        return
    first = segments[0]
    size = first.size
    if first.start_offset % size:
        raise CommitlogLayoutError(
            f"first segment {first.path.name} does not start at a multiple of the "
            f"segment size {size}"
        )
    for prev, cur in itertools.pairwise(segments):
        if cur.size != size:
            raise CommitlogLayoutError(
                f"segment {cur.path.name} is {cur.size} bytes, segment {first.path.name} "
                f"is {size}: all segments must have the same size"
            )
        if cur.start_offset != prev.end_offset:
            kind = "gap" if cur.start_offset > prev.end_offset else "overlap"
            raise CommitlogLayoutError(
                f"{kind} in the segment chain: {prev.path.name} + {size} bytes ends at "
                f"{segment_name(prev.end_offset)}, next segment is {cur.path.name}"
            )

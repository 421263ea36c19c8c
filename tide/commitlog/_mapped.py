"""Read-only segment mappings and the torn-tail/corruption decision shared by reader and verify.

Nothing here keeps a memoryview on a mapping: slices of an mmap are bytes copies, and
the format functions only make short-lived views, so every mapping can be closed.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tide.commitlog._layout import CommitlogLayoutError, SegmentFile
from tide.format import TailMarks, data_end, find_data_after


@contextmanager
def map_segment(segment: SegmentFile) -> Iterator[mmap.mmap]:
    """Map a segment read-only; fail if its size changed since the layout was read."""
    with segment.path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != segment.size:
            raise CommitlogLayoutError(
                f"segment {segment.path} changed size while reading: {segment.size} -> {size}"
            )
        with mmap.mmap(f.fileno(), segment.size, access=mmap.ACCESS_READ) as mm:
            yield mm


def is_zero(mm: mmap.mmap, start: int, end: int) -> bool:
    """Whether ``mm[start:end]`` holds only zero bytes."""
    return data_end(mm, start, end) == start


def segment_has_data(segment: SegmentFile) -> bool:
    with map_segment(segment) as mm:
        return not is_zero(mm, 0, segment.size)


@dataclass(frozen=True, slots=True)
class Resume:
    """Where valid data continues after a problem: segment index and position in it."""

    segment_index: int
    pos: int
    why: str


def find_resume(
    segments: Sequence[SegmentFile], index: int, mm: mmap.mmap, pos: int
) -> Resume | None:
    """After a bad spot at ``segments[index]`` + ``pos``: where data follows, or None.

    A later valid record or blank marker in the same segment, or any non-zero byte in a
    later segment, is valid data (``tide.format._resync``); None means nothing follows.
    """
    segment = segments[index]
    found = find_data_after(mm, pos, segment.size, segment.start_offset)
    if found is not None:
        return Resume(index, found[0], found[1])
    for later in range(index + 1, len(segments)):
        if segment_has_data(segments[later]):
            name = segments[later].path.name
            return Resume(later, 0, f"later segment {name} holds data")
    return None


@dataclass(frozen=True, slots=True)
class TornTail:
    """Invalid bytes at the end of the data: a clean end after a crash.

    ``bytes`` runs from ``offset`` to the last non-zero byte of the log.
    """

    offset: int
    bytes: int
    reason: str


@dataclass(frozen=True, slots=True)
class Stop:
    """What the invalid bytes at a spot are: ``corruption`` (its description; valid data
    continues at ``resume`` if any), else the end of the data, ``torn`` unless zeros."""

    corruption: str | None = None
    resume: Resume | None = None
    torn: TornTail | None = None


def classify_stop(
    segments: Sequence[SegmentFile],
    index: int,
    mm: mmap.mmap,
    pos: int,
    reason: str,
    marks: TailMarks,
) -> Stop:
    """Decide about the invalid bytes at ``segments[index]`` + ``pos`` by
    :meth:`TailMarks.is_corruption`, as recovery does."""
    offset = segments[index].start_offset + pos
    resume = find_resume(segments, index, mm, pos)
    if marks.is_corruption(offset, resume is not None):
        why = resume.why if resume else f"below the durable offset {marks.durable_offset}"
        return Stop(corruption=f"{reason}; {why}", resume=resume)
    if resume is not None:
        why = f"{reason}; {resume.why}: the write the crash interrupted, cut by recovery"
        return Stop(torn=TornTail(offset, _data_extent(segments, index, mm, pos), why))
    if is_zero(mm, pos, segments[index].size):
        return Stop()
    return Stop(torn=TornTail(offset, data_end(mm, pos, segments[index].size) - pos, reason))


def _data_extent(segments: Sequence[SegmentFile], index: int, mm: mmap.mmap, pos: int) -> int:
    """Bytes from ``segments[index]`` + ``pos`` to the last non-zero byte of the log."""
    for later in range(len(segments) - 1, index, -1):
        with map_segment(segments[later]) as later_mm:
            end = data_end(later_mm, 0, segments[later].size)
        if end > 0:
            return segments[later].start_offset + end - (segments[index].start_offset + pos)
    return data_end(mm, pos, segments[index].size) - pos

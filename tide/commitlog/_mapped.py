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
from tide.format import data_end, find_data_after


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

    None means nothing valid follows: the bad spot is a torn tail (a clean end after a
    crash). A later valid record or blank marker in the same segment, or any non-zero
    byte in a later segment, means the bad spot is corruption.
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

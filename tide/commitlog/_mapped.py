"""Read-only segment mappings and the torn-tail/corruption decision shared by reader and verify.

Nothing here keeps a memoryview on a mapping: slices of an mmap are bytes copies, and
the format functions only make short-lived views, so every mapping can be closed.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tide.commitlog._layout import CommitlogLayoutError, SegmentFile
from tide.format import BLANK_MAGIC, find_next_record

ZERO_CHUNK_BYTES = 1 << 20
_ZEROS = bytes(ZERO_CHUNK_BYTES)
MAX_BLANK_CANDIDATES = 10_000
_I32 = struct.Struct(">i")
_BLANK_MAGIC_BYTES = _I32.pack(BLANK_MAGIC)


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
    """Whether ``mm[start:end]`` holds only zero bytes (compared a chunk at a time)."""
    pos = start
    while pos < end:
        n = min(ZERO_CHUNK_BYTES, end - pos)
        if mm[pos : pos + n] != _ZEROS[:n]:
            return False
        pos += n
    return True


def data_end(mm: mmap.mmap, start: int, end: int) -> int:
    """One past the last non-zero byte of ``mm[start:end]``, or ``start`` if all zero."""
    pos = end
    while pos > start:
        n = min(ZERO_CHUNK_BYTES, pos - start)
        chunk = mm[pos - n : pos]
        stripped = len(chunk.rstrip(b"\0"))
        if stripped:
            return pos - n + stripped
        pos -= n
    return start


def segment_has_data(segment: SegmentFile) -> bool:
    with map_segment(segment) as mm:
        return not is_zero(mm, 0, segment.size)


def find_blank_marker(mm: mmap.mmap, start: int, limit: int) -> int:
    """Position of a blank marker after ``start`` whose size reaches ``limit`` exactly, or -1.

    Looks at no more than :data:`MAX_BLANK_CANDIDATES` occurrences of the blank magic.
    """
    magic_pos = mm.find(_BLANK_MAGIC_BYTES, start + 1, limit)
    for _ in range(MAX_BLANK_CANDIDATES):
        if magic_pos < 0:
            return -1
        marker = magic_pos - 4
        if marker > start and _I32.unpack(mm[marker:magic_pos])[0] == limit - marker:
            return marker
        magic_pos = mm.find(_BLANK_MAGIC_BYTES, magic_pos + 1, limit)
    return -1


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
    found = find_next_record(mm, pos, segment.size, segment.start_offset)
    if found >= 0:
        return Resume(index, found, f"a valid record follows at {segment.start_offset + found}")
    blank = find_blank_marker(mm, pos, segment.size)
    if blank >= 0:
        return Resume(index, blank, f"a blank marker follows at {segment.start_offset + blank}")
    for later in range(index + 1, len(segments)):
        if segment_has_data(segments[later]):
            name = segments[later].path.name
            return Resume(later, 0, f"later segment {name} holds data")
    return None

"""Telling a torn tail from corruption.

After a crash, the bytes past the last complete record are a *torn tail*: a clean end.
An invalid spot followed by valid data is *corruption* and must be reported. Valid data
is: a record found by its magic number that is complete, passes its CRC and names its own
position in ``physical_offset`` (so a stray byte pattern inside a body cannot pass); a
blank marker whose size reaches exactly to the segment end; or, in a later segment, any
non-zero byte.

One exception, and one addition, both from :class:`TailMarks`. After a crash, the bytes
from the last offset the store recorded as durable on are undefined: the copy a process
was killed in lands in any order (glibc's ``memcpy`` stores the first bytes of a copy
last, so a record's header can be zeros while the rest of its batch is there), and a
power loss keeps any subset of the pages that were not flushed. Invalid bytes there are a
torn tail even when valid records follow them; those records were never acknowledged as
durable. And invalid bytes below the durable offset are corruption even when nothing
follows them: a flushed write was lost.

Recovery (storage), ``tide store verify`` and ``tide store dump`` all decide with
:func:`find_data_after` and :meth:`TailMarks.is_corruption`, so they cannot disagree.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

from tide.format._record import (
    BLANK_MAGIC,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    ScanKind,
    scan_record,
)

Searchable = bytes | bytearray | mmap.mmap
_I32 = struct.Struct(">i")
_MAGICS = tuple(_I32.pack(m) for m in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2))
_BLANK_MAGIC_BYTES = _I32.pack(BLANK_MAGIC)
MAX_RESYNC_CANDIDATES = 100_000
MAX_BLANK_CANDIDATES = 10_000
ZERO_CHUNK_BYTES = 1 << 20


def find_next_record(buf: Searchable, start: int, limit: int, base_offset: int) -> int:
    """Position (relative to ``buf``) of the first valid record after ``start``, or -1.

    ``base_offset`` is the commitlog offset of ``buf[0]``. Looks at no more than
    :data:`MAX_RESYNC_CANDIDATES` magic-number candidates.
    """
    find = buf.find
    checked = 0
    positions = {magic: find(magic, start + 1, limit) for magic in _MAGICS}
    while checked < MAX_RESYNC_CANDIDATES:
        live = [(p, m) for m, p in positions.items() if p >= 0]
        if not live:
            return -1
        magic_pos, magic = min(live)
        record_pos = magic_pos - 4
        if record_pos > start:
            scan = scan_record(buf, record_pos, limit, expected_offset=base_offset + record_pos)
            if scan.kind is ScanKind.RECORD:
                return record_pos
        checked += 1
        positions[magic] = find(magic, magic_pos + 1, limit)
    return -1


def find_blank_marker(buf: Searchable, start: int, limit: int) -> int:
    """Position of a blank marker after ``start`` whose size reaches ``limit`` exactly, or
    -1. Looks at no more than :data:`MAX_BLANK_CANDIDATES` candidates."""
    magic_pos = buf.find(_BLANK_MAGIC_BYTES, start + 1, limit)
    for _ in range(MAX_BLANK_CANDIDATES):
        if magic_pos < 0:
            return -1
        marker = magic_pos - 4
        if marker > start and _I32.unpack(buf[marker:magic_pos])[0] == limit - marker:
            return marker
        magic_pos = buf.find(_BLANK_MAGIC_BYTES, magic_pos + 1, limit)
    return -1


def data_end(buf: Searchable, start: int, end: int) -> int:
    """One past the last non-zero byte of ``buf[start:end]``, or ``start`` if all zero."""
    pos = end
    while pos > start:
        n = min(ZERO_CHUNK_BYTES, pos - start)
        stripped = len(buf[pos - n : pos].rstrip(b"\0"))
        if stripped:
            return pos - n + stripped
        pos -= n
    return start


def find_data_after(
    buf: Searchable, pos: int, limit: int, base_offset: int
) -> tuple[int, str] | None:
    """Valid data after a bad spot at ``buf[pos]`` in the same segment: (position, what),
    or None. (Later segments: the caller checks them for any non-zero byte.)"""
    found = find_next_record(buf, pos, limit, base_offset)
    if found >= 0:
        return found, f"a valid record follows at {base_offset + found}"
    blank = find_blank_marker(buf, pos, limit)
    if blank >= 0:
        return blank, f"a blank marker follows at {base_offset + blank}"
    return None


@dataclass(frozen=True, slots=True)
class TailMarks:
    """What a store root says about the end of its commitlog: ``durable_offset``, below
    which every byte was flushed (queue_offsets.json's ``flushedOffset``, rewritten every
    10 s and at a clean close; 0 when unknown), and ``crashed``: the last process did not
    close cleanly (its ``abort`` file is there), so a write may have been interrupted.
    The default knows nothing: no durable offset, no crash."""

    durable_offset: int = 0
    crashed: bool = False

    def is_corruption(self, bad_offset: int, data_follows: bool) -> bool:
        """Whether invalid bytes at ``bad_offset`` are corruption (else: a torn tail, or
        the clean end of the data when they are zeros and nothing follows)."""
        assert bad_offset >= 0 and self.durable_offset >= 0, (bad_offset, self)
        if bad_offset < self.durable_offset:
            return True  # a flushed write went bad
        if not data_follows:
            return False  # the end of the data
        return not self.crashed  # after a clean close, no write was interrupted

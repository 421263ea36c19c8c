"""The pull's per-record work on spans of stored records: the storage's check that a span
read holds whole records (:func:`span_records`) and the gateway's tag filter
(:func:`record_tags`). Each runs in the compiled core when it is built
(``tide.format._ccore``) and has its pure-Python reference here, held equal by
tests/format/test_ccore_spans.py (docs/performance.md, "The compiled core").
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from tide.format import _core
from tide.format._properties import TAGS
from tide.format._record import (
    FIXED_BYTES_V4,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    PHYSICAL_OFFSET_POS,
    Buffer,
    record_properties,
)

# TOTALSIZE, MAGICCODE, then (BODYCRC, QUEUEID, FLAG, QUEUEOFFSET) skipped, PHYSICALOFFSET.
_SPAN_HEADER = struct.Struct(f">ii{PHYSICAL_OFFSET_POS - 8}xq")
_MESSAGE_MAGICS = frozenset((MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2))
_SIZE_BYTES = 4

_span_records_c: Callable[[Buffer, int, int], int] | None = (
    None if _core.ccore is None else _core.ccore.span_records
)
_record_tags_c: Callable[[Buffer, int], tuple[list[int], list[str]] | None] | None = (
    None if _core.ccore is None else _core.ccore.record_tags
)


def span_records(piece: Buffer, offset: int, at_most: int) -> int:
    """How many message records fill ``piece`` (stored at commitlog ``offset``) exactly,
    each at its PHYSICALOFFSET, or -1 when its bytes are not whole records or hold more
    than ``at_most``."""
    if _span_records_c is not None:
        return _span_records_c(piece, offset, at_most)
    return span_records_python(piece, offset, at_most)


def span_records_python(piece: Buffer, offset: int, at_most: int) -> int:
    """:func:`span_records` in Python: the reference of ``_ccore.span_records``."""
    unpack = _SPAN_HEADER.unpack_from
    pos, end, found = 0, len(piece), 0
    while pos < end:
        if end - pos < FIXED_BYTES_V4 or found == at_most:
            return -1
        total_size, magic, physical_offset = unpack(piece, pos)
        if (
            magic not in _MESSAGE_MAGICS
            or not FIXED_BYTES_V4 <= total_size <= end - pos
            or physical_offset != offset + pos
        ):
            return -1
        pos += total_size
        found += 1
    return found


def record_tags(records: bytes, count: int) -> tuple[list[int], list[str]]:
    """The TOTALSIZE and TAGS ('' when absent) of each of the ``count`` records back to
    back in ``records``. Raises RecordError (or struct.error on cut bytes) or
    AssertionError when the records do not end with the bytes."""
    if _record_tags_c is not None:
        found = _record_tags_c(records, count)
        if found is not None:
            return found
    # not built, or a record the compiled path does not read (IPv6 hosts, a two-byte
    # topic length, damage): the reference reads it and says what is wrong
    return record_tags_python(records, count)


def record_tags_python(records: bytes, count: int) -> tuple[list[int], list[str]]:
    """:func:`record_tags` in Python: the reference of ``_ccore.record_tags``."""
    view = memoryview(records)
    sizes: list[int] = []
    tags: list[str] = []
    pos = 0
    for _ in range(count):
        size = int.from_bytes(view[pos : pos + _SIZE_BYTES], "big")
        sizes.append(size)
        tags.append(record_properties(view, pos, size).get(TAGS, ""))
        pos += size
    assert pos == len(records), f"{count} records end at {pos} of {len(records)} bytes"
    return sizes, tags

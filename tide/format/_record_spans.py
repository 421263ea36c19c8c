"""The pull's per-record work on spans of stored records: the storage's check that a span
read holds whole records (:func:`span_records`) and the gateway's tag filter
(:func:`record_tags`). Each runs in the compiled core when it is built
(``tide.format._ccore``) and has its pure-Python reference here, held equal by
tests/format/test_ccore_spans.py (docs/performance.md, "The compiled core").
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import TypeAlias

from tide.format import _core
from tide.format._properties import TAGS, decode_properties
from tide.format._record import (
    FIXED_BYTES_V4,
    HEADER_V4_BYTES,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    PHYSICAL_OFFSET_POS,
    RECORD_HEADER_V4,
    SYSFLAG_HOSTS_V6,
    Buffer,
    record_properties,
)

# TOTALSIZE, MAGICCODE, then (BODYCRC, QUEUEID, FLAG, QUEUEOFFSET) skipped, PHYSICALOFFSET.
_SPAN_HEADER = struct.Struct(f">ii{PHYSICAL_OFFSET_POS - 8}xq")
_MESSAGE_MAGICS = frozenset((MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2))
_SIZE_BYTES = 4
_U16 = struct.Struct(">H")

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


# v4_record_fields' answer: sizes, queue ids, queue offsets, physical offsets, born and
# store times, born and store hosts (packed), reconsume times, bodies, topics (bytes),
# properties (decoded).
RecordFields: TypeAlias = tuple[
    list[int],
    list[int],
    list[int],
    list[int],
    list[int],
    list[int],
    list[bytes],
    list[bytes],
    list[int],
    list[bytes],
    list[bytes],
    list[dict[str, str]],
]
_v4_record_fields_c: (
    Callable[[Buffer, int, Callable[[bytes], dict[str, str]]], RecordFields | None] | None
) = None if _core.ccore is None else _core.ccore.v4_record_fields


def v4_record_fields(records: bytes, count: int) -> RecordFields | None:
    """The fields of the ``count`` records back to back in ``records``, as columns, when
    each is a V1-magic IPv4 record whose lengths add up, body CRC checks and physical
    offset is not negative, and they fill the bytes; else None (the caller's decoder then
    reads them one by one and names the record that fails)."""
    if _v4_record_fields_c is not None:
        return _v4_record_fields_c(records, count, decode_properties)
    return v4_record_fields_python(records, count)


def v4_record_fields_python(records: bytes, count: int) -> RecordFields | None:
    """:func:`v4_record_fields` in Python: the reference of ``_ccore.v4_record_fields``."""
    columns: RecordFields = ([], [], [], [], [], [], [], [], [], [], [], [])
    pos, end = 0, len(records)
    for _ in range(count):
        if end - pos < FIXED_BYTES_V4 or not _v4_fields_into(records, pos, columns):
            return None
        pos += columns[0][-1]
    return columns if pos == end else None


def _v4_fields_into(data: bytes, pos: int, columns: RecordFields) -> bool:
    """Append the fields of the record at ``data[pos:]`` when it is one this path reads."""
    (
        size,
        magic,
        body_crc,
        queue_id,
        _,
        queue_offset,
        physical_offset,
        sys_flag,
        born_ms,
        born,
        store_ms,
        store,
        reconsume_times,
        _,
        body_len,
    ) = RECORD_HEADER_V4.unpack_from(data, pos)
    end = pos + size
    if magic != MESSAGE_MAGIC_V1 or sys_flag & SYSFLAG_HOSTS_V6 or not body_len >= 0:
        return False
    if not FIXED_BYTES_V4 <= size <= len(data) - pos:
        return False
    topic_at = pos + HEADER_V4_BYTES + body_len
    if topic_at + 3 > end:
        return False
    props_len_at = topic_at + 1 + data[topic_at]
    if props_len_at + 2 > end or props_len_at + 2 + _U16.unpack_from(data, props_len_at)[0] != end:
        return False
    body = data[pos + HEADER_V4_BYTES : topic_at]
    if zlib.crc32(body) != body_crc or physical_offset < 0:
        return False
    columns[0].append(size)
    columns[1].append(queue_id)
    columns[2].append(queue_offset)
    columns[3].append(physical_offset)
    columns[4].append(born_ms)
    columns[5].append(store_ms)
    columns[6].append(born)
    columns[7].append(store)
    columns[8].append(reconsume_times)
    columns[9].append(body)
    columns[10].append(data[topic_at + 1 : props_len_at])
    props = data[props_len_at + 2 : end]
    columns[11].append(decode_properties(props) if props else {})
    return True

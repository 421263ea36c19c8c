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
from typing import Any, Literal, TypeAlias, cast, overload

from tide.format import _core
from tide.format._columns import TagColumns
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
_record_tags_c: Callable[[Buffer, int], TagColumns | None] | None = (
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


def record_tags(records: bytes, count: int) -> TagColumns:
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


def record_tags_python(records: bytes, count: int) -> TagColumns:
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
# properties (decoded); with ``stored``, then flags, sys flags, prepared transaction
# offsets and body CRCs (what a StoredMessage has and a client's message has not).
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
StoredRecordFields: TypeAlias = tuple[
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
    list[int],
    list[int],
    list[int],
    list[int],
]
_v4_record_fields_c: Callable[..., Any] | None = (
    None if _core.ccore is None else _core.ccore.v4_record_fields
)


@overload
def v4_record_fields(
    records: bytes, count: int, stored: Literal[False] = False
) -> RecordFields | None: ...
@overload
def v4_record_fields(
    records: bytes, count: int, stored: Literal[True]
) -> StoredRecordFields | None: ...
@overload
def v4_record_fields(
    records: bytes, count: int, stored: bool
) -> RecordFields | StoredRecordFields | None: ...
def v4_record_fields(
    records: bytes, count: int, stored: bool = False
) -> RecordFields | StoredRecordFields | None:
    """The fields of the ``count`` records back to back in ``records``, as columns (12;
    16 when ``stored``), when each is a V1-magic IPv4 record whose lengths add up, body
    CRC checks and physical offset is not negative, and they fill the bytes; else None
    (the caller's decoder then reads them one by one and names the record that fails).

    tide.format's one reader of whole records (docs/performance.md, "One place knows
    each layout"): the client's decoding of pulled records and, with ``stored``, the
    storage's StoredMessage reads (services/storage/convert.py) both call it."""
    if _v4_record_fields_c is not None:
        found: RecordFields | StoredRecordFields | None = _v4_record_fields_c(
            records, count, decode_properties, stored
        )
        return found
    return v4_record_fields_python(records, count, stored)


@overload
def v4_record_fields_python(
    records: bytes, count: int, stored: Literal[False] = False
) -> RecordFields | None: ...
@overload
def v4_record_fields_python(
    records: bytes, count: int, stored: Literal[True]
) -> StoredRecordFields | None: ...
@overload
def v4_record_fields_python(
    records: bytes, count: int, stored: bool
) -> RecordFields | StoredRecordFields | None: ...
def v4_record_fields_python(
    records: bytes, count: int, stored: bool = False
) -> RecordFields | StoredRecordFields | None:
    """:func:`v4_record_fields` in Python: the reference of ``_ccore.v4_record_fields``."""
    columns: tuple[list[Any], ...] = tuple([] for _ in range(16 if stored else 12))
    (
        add_size,
        add_queue_id,
        add_queue_offset,
        add_physical_offset,
        add_born_ms,
        add_store_ms,
        add_born,
        add_store,
        add_reconsume,
        add_body,
        add_topic,
        add_props,
    ) = (column.append for column in columns[:12])
    extra = [column.append for column in columns[12:]]
    unpack = RECORD_HEADER_V4.unpack_from
    u16 = _U16.unpack_from
    crc32 = zlib.crc32
    pos, end_of_records = 0, len(records)
    for _ in range(count):
        if end_of_records - pos < FIXED_BYTES_V4:
            return None
        (
            size,
            magic,
            body_crc,
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sys_flag,
            born_ms,
            born,
            store_ms,
            store,
            reconsume_times,
            prepared_transaction_offset,
            body_len,
        ) = unpack(records, pos)
        end = pos + size
        topic_at = pos + HEADER_V4_BYTES + body_len
        if (
            magic != MESSAGE_MAGIC_V1
            or sys_flag & SYSFLAG_HOSTS_V6
            or body_len < 0
            or not FIXED_BYTES_V4 <= size <= end_of_records - pos
            or topic_at + 3 > end
        ):
            return None
        props_len_at = topic_at + 1 + records[topic_at]
        if props_len_at + 2 > end or props_len_at + 2 + u16(records, props_len_at)[0] != end:
            return None
        body = records[pos + HEADER_V4_BYTES : topic_at]
        if crc32(body) != body_crc or physical_offset < 0:
            return None
        props = records[props_len_at + 2 : end]
        add_size(size)
        add_queue_id(queue_id)
        add_queue_offset(queue_offset)
        add_physical_offset(physical_offset)
        add_born_ms(born_ms)
        add_store_ms(store_ms)
        add_born(born)
        add_store(store)
        add_reconsume(reconsume_times)
        add_body(body)
        add_topic(records[topic_at + 1 : props_len_at])
        add_props(decode_properties(props) if props else {})
        if extra:
            extra[0](flag)
            extra[1](sys_flag)
            extra[2](prepared_transaction_offset)
            extra[3](body_crc)
        pos = end
    if pos != end_of_records:
        return None
    return cast(RecordFields | StoredRecordFields, columns)

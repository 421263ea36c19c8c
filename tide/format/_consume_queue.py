"""Consume queue entries (docs/formats.md, "Consume queue").

One logical file per (topic, queue_id): entry ``n`` (the queue offset) lives at byte
``n * 20``. The logical file is cut into segments of ``entries_per_segment`` entries
(default 300,000, so 6,000,000 bytes), each named by the 20-digit start *byte* offset in
the logical file (``00000000000006000000`` is the second default segment).

Entry, big-endian: ``commitlog_offset:i64 size:i32 tags_code:i64`` (RocketMQ
``ConsumeQueue.putMessagePositionInfo``: ``putLong(offset); putInt(size); putLong(tagsCode)``).
Unwritten bytes are zeros. RocketMQ's recovery keeps an entry while ``offset >= 0 && size > 0``
and stops at the first other one, so an all-zero entry is the end of the queue.
"""

from __future__ import annotations

import mmap
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, TypeAlias

from tide.format import _core
from tide.format._record import Buffer
from tide.format._segments import segment_name

# What entries and index slots are written to: a file's mmap, or a bytearray in tests.
WritableBuffer: TypeAlias = bytearray | memoryview | mmap.mmap

ENTRY_BYTES = 20
DEFAULT_ENTRIES_PER_SEGMENT = 300_000
DEFAULT_SEGMENT_BYTES = DEFAULT_ENTRIES_PER_SEGMENT * ENTRY_BYTES  # 6,000,000
# ConsumeQueue.fillPreBlank pads a queue whose first segment starts mid-segment with
# entries (0, Integer.MAX_VALUE, 0) up to the first real entry.
PRE_BLANK_SIZE = 0x7FFFFFFF

_ENTRY = struct.Struct(">qiq")
assert _ENTRY.size == ENTRY_BYTES


class ConsumeQueueEntry(NamedTuple):
    commitlog_offset: int
    size: int
    tags_code: int


def pack_entry(commitlog_offset: int, size: int, tags_code: int) -> bytes:
    """The 20 bytes of one entry."""
    return _ENTRY.pack(commitlog_offset, size, tags_code)


def pack_entry_into(
    buf: WritableBuffer, pos: int, commitlog_offset: int, size: int, tags_code: int
) -> None:
    """Write one entry at ``pos`` of a writable buffer (a segment's mmap or a bytearray)."""
    _ENTRY.pack_into(buf, pos, commitlog_offset, size, tags_code)


def pack_entries(
    commitlog_offsets: Iterable[int], sizes: Iterable[int], tags_codes: Iterable[int]
) -> bytes:
    """The bytes of consecutive entries (``pack_entry`` of each, joined): the compiled
    core's ``consume_queue_entries`` for three lists or tuples of one length whose values
    fit, else (or on the pure-Python path) :func:`pack_entries_python`, which also says
    what does not fit."""
    compiled = _compiled_entries
    if compiled is not None:
        data = compiled(commitlog_offsets, sizes, tags_codes)
        if data is not None:
            return data
    return pack_entries_python(commitlog_offsets, sizes, tags_codes)


def pack_entries_python(
    commitlog_offsets: Iterable[int], sizes: Iterable[int], tags_codes: Iterable[int]
) -> bytes:
    """:func:`pack_entries`' pure-Python twin (tests/format/test_ccore_entries.py).

    One ``struct`` call per entry, in C; or, for a run of sequences whose entries all
    have the same tags code (one tag), column by column: the entries start as copies of
    one (size and tags code), then the big-endian bytes of the offsets (and of the sizes
    when they differ) go into place with one strided copy per byte of the field, about
    twice as fast. Values that do not fit raise (struct.error or OverflowError).
    """
    if (
        isinstance(commitlog_offsets, list | tuple)
        and isinstance(sizes, list | tuple)
        and isinstance(tags_codes, list | tuple)
        and len(commitlog_offsets) >= _COLUMNS_FROM
        and tags_codes.count(tags_codes[0]) == len(commitlog_offsets) == len(sizes)
    ):
        return _pack_same_tags(commitlog_offsets, sizes, tags_codes[0])
    return b"".join(map(_ENTRY.pack, commitlog_offsets, sizes, tags_codes))


_compiled_entries: Callable[[Iterable[int], Iterable[int], Iterable[int]], bytes | None] | None = (
    None if _core.ccore is None else _core.ccore.consume_queue_entries
)
_COLUMNS_FROM = 16  # fewer entries: one struct call each is as fast
_LITTLE = sys.byteorder == "little"
_SIZE_AND_TAGS = struct.Struct(">iq")  # an entry's last 12 bytes


def _pack_same_tags(
    commitlog_offsets: Sequence[int], sizes: Sequence[int], tags_code: int
) -> bytes:
    count = len(commitlog_offsets)
    same_size = sizes.count(sizes[0]) == count
    template = bytes(8) + _SIZE_AND_TAGS.pack(sizes[0] if same_size else 0, tags_code)
    out = bytearray(template * count)
    for pos, code, column in ((0, "q", commitlog_offsets), (8, "i", None if same_size else sizes)):
        if column is None:
            continue
        typed = array(code, column)  # range-checked: OverflowError
        if _LITTLE:
            typed.byteswap()
        raw = typed.tobytes()
        width = typed.itemsize
        for byte in range(width):
            out[pos + byte :: ENTRY_BYTES] = raw[byte::width]
    return bytes(out)


def iter_entries(buf: Buffer) -> Iterator[tuple[int, int, int]]:
    """The whole entries of ``buf`` as bare ``(commitlog_offset, size, tags_code)`` tuples,
    made in C (the reader's mirror of :func:`pack_entries`, for hot read paths)."""
    return _ENTRY.iter_unpack(buf)


def first_unwritten(data: Buffer) -> int:
    """Index of the first entry of ``data`` that RocketMQ's recovery does not count as
    written (``offset < 0 or size <= 0``), or the entry count if all are; ValueError when
    ``data`` is not whole entries. In the compiled core (``_ccore.first_unwritten``: one
    pass, no copy) when it is built, else :func:`first_unwritten_python`."""
    compiled = _compiled_first_unwritten
    if compiled is not None:
        return compiled(data)
    return first_unwritten_python(data)


def first_unwritten_python(data: Buffer) -> int:
    """:func:`first_unwritten` in Python (tests/format/test_ccore_entry_spans.py).

    Column-wise with C-speed bytes operations (a 6 MB segment in milliseconds): the sign
    byte of every offset and size, and the OR of the four size bytes."""
    data = bytes(data)
    count, rest = divmod(len(data), ENTRY_BYTES)
    if rest:
        raise ValueError(
            f"consume queue entries of {len(data)} bytes: not a multiple of {ENTRY_BYTES} "
            "(one entry)"
        )
    if not count:
        return 0
    negative_offset = data[0::ENTRY_BYTES].translate(_SIGN_BIT).find(1)
    negative_size = data[_SIZE_POS::ENTRY_BYTES].translate(_SIGN_BIT).find(1)
    size_bits = 0
    for column in range(_SIZE_POS, _SIZE_POS + 4):
        size_bits |= int.from_bytes(data[column::ENTRY_BYTES], "big")
    zero_size = size_bits.to_bytes(count, "big").find(0)
    return min(i for i in (negative_offset, negative_size, zero_size, count) if i >= 0)


_compiled_first_unwritten: Callable[[Buffer], int] | None = (
    None if _core.ccore is None else _core.ccore.first_unwritten
)
_SIZE_POS = 8  # an entry's size, after its commitlog offset
# bytes.translate table: 1 for a byte with the sign bit set, else 0.
_SIGN_BIT = bytes(int(b >= 0x80) for b in range(256))


def unpack_entry(buf: Buffer, pos: int = 0) -> ConsumeQueueEntry:
    """The entry at ``pos`` (raises struct.error when fewer than 20 bytes remain)."""
    return ConsumeQueueEntry(*_ENTRY.unpack_from(buf, pos))


PRE_BLANK_ENTRY = pack_entry(0, PRE_BLANK_SIZE, 0)


def entry_is_written(entry: ConsumeQueueEntry) -> bool:
    """RocketMQ's recovery test (``offset >= 0 && size > 0``); false for an all-zero entry."""
    return entry.commitlog_offset >= 0 and entry.size > 0


def consume_queue_segment_bytes(entries_per_segment: int = DEFAULT_ENTRIES_PER_SEGMENT) -> int:
    assert entries_per_segment > 0, entries_per_segment
    return entries_per_segment * ENTRY_BYTES


def logical_position(queue_offset: int) -> int:
    """Byte offset of entry ``queue_offset`` in the queue's logical file."""
    assert queue_offset >= 0, queue_offset
    return queue_offset * ENTRY_BYTES


def segment_start_for(
    queue_offset: int, entries_per_segment: int = DEFAULT_ENTRIES_PER_SEGMENT
) -> int:
    """Start byte offset (= file name) of the segment that holds entry ``queue_offset``."""
    size = consume_queue_segment_bytes(entries_per_segment)
    pos = logical_position(queue_offset)
    return pos - pos % size


def position_in_segment(
    queue_offset: int, entries_per_segment: int = DEFAULT_ENTRIES_PER_SEGMENT
) -> int:
    """Byte position of entry ``queue_offset`` inside its segment file."""
    pos = logical_position(queue_offset) % consume_queue_segment_bytes(entries_per_segment)
    assert pos % ENTRY_BYTES == 0, pos
    return pos


def consume_queue_segment_name(
    queue_offset: int, entries_per_segment: int = DEFAULT_ENTRIES_PER_SEGMENT
) -> str:
    """The 20-digit file name of the segment that holds entry ``queue_offset``."""
    return segment_name(segment_start_for(queue_offset, entries_per_segment))


def first_queue_offset(segment_start: int) -> int:
    """Queue offset of the first entry of the segment starting at byte ``segment_start``."""
    if segment_start < 0 or segment_start % ENTRY_BYTES:
        raise ValueError(f"consume queue segment start {segment_start} is not a multiple of 20")
    return segment_start // ENTRY_BYTES

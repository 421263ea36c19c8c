"""The index file: a hash map from message key to commitlog offset, chained on disk.

docs/formats.md, "Index file". Big-endian, three regions::

    header   40 bytes  begin_timestamp:i64 end_timestamp:i64 begin_phy_offset:i64
                       end_phy_offset:i64 hash_slot_count:i32 index_count:i32
    slots    slot_count x i32            number of the newest entry of the slot, 0 = empty
    entries  max_entries x 20 bytes      key_hash:i32 phy_offset:i64 time_diff_s:i32
                                         prev_entry_number:i32

Entry numbers start at 1: number 0 means "none" in slots and in ``prev_entry_number``, so
entry 0's 20 bytes are never written and a file holds at most ``max_entries - 1`` entries.
``index_count`` is the number the next entry will get; a fresh (all-zero) file reads as 1,
as RocketMQ's ``IndexHeader.load`` does.

:func:`put_key` and :func:`select_phy_offsets` are RocketMQ's ``IndexFile.putKey`` and
``IndexFile.selectPhyOffset`` as pure functions over a buffer (the file's mmap, or a
bytearray), which hold no state of their own: the header is read from the buffer on every
call, so one writer at a time. The key they take is the full index key, ``topic + "#" + key``
(``IndexService.buildKey``; see :func:`index_key`). Only the key's hash is stored, so a
match must still be checked against the message's real keys.

For dispatch, :func:`put_keys` is ``put_key`` for a batch of keys (same bytes, the header
read and written once, the entries in one slice) and :func:`index_key_hashes` hashes a
batch of keys at once.

Index files are named by their creation time, ``yyyyMMddHHmmssSSS`` in local time
(``UtilAll.timeMillisToHumanString``), so names sort in creation order.
"""

from __future__ import annotations

import datetime
import functools
import os
import struct
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat

# (operator's functions: int.__mod__ and memoryview.__getitem__ are ~2x slower in map)
from operator import and_, floordiv, getitem, mod, mul, setitem, sub
from typing import NamedTuple, cast

from tide.format._consume_queue import WritableBuffer
from tide.format._javahash import index_key_hash
from tide.format._record import Buffer

INDEX_HEADER_BYTES = 40
HASH_SLOT_BYTES = 4
INDEX_ENTRY_BYTES = 20
DEFAULT_INDEX_SLOT_COUNT = 5_000_000
DEFAULT_INDEX_MAX_ENTRIES = 20_000_000
INVALID_INDEX = 0  # IndexFile.invalidIndex: "no entry"
INT_MAX = 0x7FFFFFFF
INDEX_FILE_NAME_DIGITS = 17

_HEADER = struct.Struct(">qqqqii")
_SLOT = struct.Struct(">i")
_ENTRY = struct.Struct(">iqii")
_I64 = struct.Struct(">q")
# Header field positions (IndexHeader.*Index).
_BEGIN_TIMESTAMP_POS = 0
_END_TIMESTAMP_POS = 8
_BEGIN_PHY_OFFSET_POS = 16
_END_PHY_OFFSET_POS = 24
assert _HEADER.size == INDEX_HEADER_BYTES
assert _SLOT.size == HASH_SLOT_BYTES
assert _ENTRY.size == INDEX_ENTRY_BYTES


@dataclass(frozen=True, slots=True)
class IndexGeometry:
    """Slot and entry counts of an index file (RocketMQ: maxHashSlotNum, maxIndexNum)."""

    slot_count: int = DEFAULT_INDEX_SLOT_COUNT
    max_entries: int = DEFAULT_INDEX_MAX_ENTRIES

    def __post_init__(self) -> None:
        if self.slot_count <= 0:
            raise ValueError(f"index slot count {self.slot_count} must be positive")
        if self.max_entries <= 1:
            raise ValueError(f"index max entries {self.max_entries} must be at least 2")
        if self.file_bytes > INT_MAX:  # RocketMQ computes the file size as a Java int
            raise ValueError(f"index file of {self.file_bytes} bytes exceeds 2^31 - 1")

    @property
    def entries_start(self) -> int:
        return INDEX_HEADER_BYTES + self.slot_count * HASH_SLOT_BYTES

    @property
    def file_bytes(self) -> int:
        return self.entries_start + self.max_entries * INDEX_ENTRY_BYTES

    @property
    def capacity(self) -> int:
        """Entries a file can hold: numbers 1 .. max_entries - 1."""
        return self.max_entries - 1

    def slot_position(self, slot: int) -> int:
        assert 0 <= slot < self.slot_count, slot
        return INDEX_HEADER_BYTES + slot * HASH_SLOT_BYTES

    def entry_position(self, number: int) -> int:
        assert 0 <= number < self.max_entries, number
        return self.entries_start + number * INDEX_ENTRY_BYTES


class IndexHeader(NamedTuple):
    begin_timestamp_ms: int = 0
    end_timestamp_ms: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1  # the number the next entry gets


class IndexEntry(NamedTuple):
    key_hash: int
    phy_offset: int
    time_diff_s: int
    prev_entry_number: int


def pack_index_header(header: IndexHeader) -> bytes:
    return _HEADER.pack(*header)


def write_index_header(buf: WritableBuffer, header: IndexHeader) -> None:
    """``header`` into the first INDEX_HEADER_BYTES of ``buf`` (in place)."""
    _HEADER.pack_into(buf, 0, *header)


def unpack_index_header(buf: Buffer) -> IndexHeader:
    """The header's 40 bytes as they are (a fresh file has ``index_count`` 0)."""
    return IndexHeader(*_HEADER.unpack_from(buf, 0))


def read_index_header(buf: Buffer) -> IndexHeader:
    """The header as RocketMQ loads it: an ``index_count`` of 0 or less reads as 1."""
    header = unpack_index_header(buf)
    return header if header.index_count > 0 else header._replace(index_count=1)


def pack_index_entry(key_hash: int, phy_offset: int, time_diff_s: int, prev: int) -> bytes:
    return _ENTRY.pack(key_hash, phy_offset, time_diff_s, prev)


def unpack_index_entry(buf: Buffer, pos: int) -> IndexEntry:
    return IndexEntry(*_ENTRY.unpack_from(buf, pos))


def read_slot(buf: Buffer, geometry: IndexGeometry, slot: int) -> int:
    """The raw slot value (not checked against the header)."""
    value: int = _SLOT.unpack_from(buf, geometry.slot_position(slot))[0]
    return value


def slot_for(key_hash: int, slot_count: int) -> int:
    """``keyHash % hashSlotNum`` (key hashes are never negative)."""
    assert key_hash >= 0, key_hash
    return key_hash % slot_count


def index_key(topic: str, key: str) -> str:
    """``IndexService.buildKey``: the string that is hashed for a message key."""
    return f"{topic}#{key}"


def _java_long_div(a: int, b: int) -> int:
    """Java's ``/`` on longs: truncates toward zero (Python's ``//`` floors)."""
    assert b > 0, b
    q = abs(a) // b
    return q if a >= 0 else -q


def time_diff_seconds(store_timestamp_ms: int, begin_timestamp_ms: int) -> int:
    """The stored time of an entry, as ``putKey`` computes it from the header's begin time."""
    if begin_timestamp_ms <= 0:
        return 0
    diff = _java_long_div(store_timestamp_ms - begin_timestamp_ms, 1000)
    return min(max(diff, 0), INT_MAX)


def init_index_header(buf: WritableBuffer, end_phy_offset: int, end_timestamp_ms: int) -> None:
    """What ``new IndexFile(..., endPhyOffset, endTimestamp)`` writes into a fresh file.

    A new file continues from the end of the previous (full) one: begin and end offsets and
    timestamps are set to the previous file's end, each pair only when positive; the
    counts stay 0. The first :func:`put_key` then replaces the begin values.
    """
    if end_phy_offset > 0:
        _I64.pack_into(buf, _BEGIN_PHY_OFFSET_POS, end_phy_offset)
        _I64.pack_into(buf, _END_PHY_OFFSET_POS, end_phy_offset)
    if end_timestamp_ms > 0:
        _I64.pack_into(buf, _BEGIN_TIMESTAMP_POS, end_timestamp_ms)
        _I64.pack_into(buf, _END_TIMESTAMP_POS, end_timestamp_ms)


def _check_size(buf: Buffer, geometry: IndexGeometry) -> None:
    if len(buf) < geometry.file_bytes:
        raise ValueError(f"index buffer of {len(buf)} bytes, geometry needs {geometry.file_bytes}")


def is_index_full(header: IndexHeader, geometry: IndexGeometry) -> bool:
    """``IndexFile.isWriteFull``: no entry number is left."""
    return header.index_count >= geometry.max_entries


def put_key(
    buf: WritableBuffer,
    geometry: IndexGeometry,
    key: str,
    phy_offset: int,
    store_timestamp_ms: int,
) -> bool:
    """Add ``key`` (the full ``topic#key``) -> ``phy_offset``; False when the file is full.

    Mirrors ``IndexFile.putKey``: the new entry (number ``index_count``) stores the key's
    hash, the offset, its time in seconds after the header's begin time and the slot's old
    value (0 unless that value is a valid entry number); the slot then points at the new
    entry; the header's begin values are set by the first entry, ``hash_slot_count`` grows
    when a slot goes from empty to used, ``index_count`` grows by one and the end values
    become this entry's.
    """
    _check_size(buf, geometry)
    header = read_index_header(buf)
    if is_index_full(header, geometry):
        return False
    key_hash = index_key_hash(key)
    slot_pos = geometry.slot_position(slot_for(key_hash, geometry.slot_count))
    number = header.index_count
    prev: int = _SLOT.unpack_from(buf, slot_pos)[0]
    if prev == number:
        # A put torn between its slot and its header (a crash): the slot names the
        # uncounted entry being rewritten now, which already links the older chain.
        # Keep that link (Java would link the entry to itself and lose the chain).
        prev = _ENTRY.unpack_from(buf, geometry.entry_position(number))[3]
        if not INVALID_INDEX < prev < number:
            prev = INVALID_INDEX
    elif prev <= INVALID_INDEX or prev > number:
        prev = INVALID_INDEX
    time_diff = time_diff_seconds(store_timestamp_ms, header.begin_timestamp_ms)
    _ENTRY.pack_into(buf, geometry.entry_position(number), key_hash, phy_offset, time_diff, prev)
    _SLOT.pack_into(buf, slot_pos, number)
    _HEADER.pack_into(buf, 0, *_header_after_put(header, phy_offset, store_timestamp_ms, prev))
    return True


def _header_after_put(
    header: IndexHeader, phy_offset: int, store_timestamp_ms: int, prev: int
) -> IndexHeader:
    first = header.index_count <= 1
    return IndexHeader(
        begin_timestamp_ms=store_timestamp_ms if first else header.begin_timestamp_ms,
        end_timestamp_ms=store_timestamp_ms,
        begin_phy_offset=phy_offset if first else header.begin_phy_offset,
        end_phy_offset=phy_offset,
        hash_slot_count=header.hash_slot_count + (1 if prev == INVALID_INDEX else 0),
        index_count=header.index_count + 1,
    )


def select_phy_offsets(
    buf: Buffer,
    geometry: IndexGeometry,
    key: str,
    max_count: int,
    begin_ms: int,
    end_ms: int,
    *,
    read: Callable[[int, int], Buffer] | None = None,
) -> list[int]:
    """Commitlog offsets indexed under ``key`` (the full ``topic#key``), newest first.

    Mirrors ``IndexFile.selectPhyOffset``: walk the slot's chain, keep entries whose hash
    equals the key's and whose time (``begin_timestamp + time_diff_s * 1000``) is inside
    ``[begin_ms, end_ms]``; stop after ``max_count`` offsets, at an invalid ``prev_entry_number``
    or one that does not go back, at a negative time diff, or at the first entry older than
    ``begin_ms``. At most ``index_count`` entries are read, whatever the file holds.
    Different keys share hashes: check each message's real keys.

    The walk reads the file's bytes with ``read(position, size)`` when given (the dispatch
    reads through the file with pread off its event loop: a chain's next entry is known
    only once the one before is read, so its pages cannot be brought in ahead), else from
    ``buf``.
    """
    _check_size(buf, geometry)
    at = read if read is not None else functools.partial(_slice, buf)
    header = read_index_header(at(0, INDEX_HEADER_BYTES))
    key_hash = index_key_hash(key)
    slot = slot_for(key_hash, geometry.slot_count)
    number: int = _SLOT.unpack(at(geometry.slot_position(slot), _SLOT.size))[0]
    if not _valid_number(number, header, geometry) or header.index_count <= 1:
        return []
    found: list[int] = []
    # Hard limit: a well-formed chain visits each entry at most once.
    for _ in range(min(header.index_count, geometry.max_entries)):
        if len(found) >= max_count:
            break
        entry = unpack_index_entry(at(geometry.entry_position(number), _ENTRY.size), 0)
        if entry.time_diff_s < 0:
            break
        time_read = header.begin_timestamp_ms + entry.time_diff_s * 1000
        if entry.key_hash == key_hash and begin_ms <= time_read <= end_ms:
            found.append(entry.phy_offset)
        prev = entry.prev_entry_number
        # RocketMQ stops at ``prev == number``; a chain it wrote always goes to lower
        # numbers, so stopping at ``prev >= number`` differs only on corrupt files, where
        # it also stops a cycle (which RocketMQ would walk until max_count).
        if not _valid_number(prev, header, geometry) or prev >= number or time_read < begin_ms:
            break
        number = prev
    return found


def _slice(buf: Buffer, position: int, size: int) -> bytes:
    return bytes(memoryview(buf)[position : position + size])


def _valid_number(number: int, header: IndexHeader, geometry: IndexGeometry) -> bool:
    # RocketMQ: 0 < number <= index_count. The bound by max_entries only matters for a
    # corrupt header; Java would read past the file, fail, and return what it had found.
    return INVALID_INDEX < number <= header.index_count and number < geometry.max_entries


def index_time_matched(header: IndexHeader, begin_ms: int, end_ms: int) -> bool:
    """``IndexFile.isTimeMatched``: may this file hold entries in ``[begin_ms, end_ms]``?"""
    begin, end = header.begin_timestamp_ms, header.end_timestamp_ms
    return (begin_ms < begin and end_ms > end) or begin <= begin_ms <= end or begin <= end_ms <= end


def index_file_name(timestamp_ms: int) -> str:
    """``UtilAll.timeMillisToHumanString``: ``yyyyMMddHHmmssSSS`` in local time."""
    seconds, millis = divmod(timestamp_ms, 1000)  # floors, as java.util.Calendar does
    tm = time.localtime(seconds)
    return (
        f"{tm.tm_year:04d}{tm.tm_mon:02d}{tm.tm_mday:02d}"
        f"{tm.tm_hour:02d}{tm.tm_min:02d}{tm.tm_sec:02d}{millis:03d}"
    )


def parse_index_file_name(name: str) -> int | None:
    """The creation time (ms, local time) an index file name stands for, or None.

    A name inside a daylight-saving fold is ambiguous; the earlier instant is returned.
    """
    if len(name) != INDEX_FILE_NAME_DIGITS or not (name.isascii() and name.isdigit()):
        return None
    year, month, day = int(name[0:4]), int(name[4:6]), int(name[6:8])
    hour, minute, second = int(name[8:10]), int(name[10:12]), int(name[12:14])
    try:
        local = datetime.datetime(year, month, day, hour, minute, second)  # validates fields
    except ValueError:
        return None
    return int(local.timestamp()) * 1000 + int(name[14:])


# -- batches -------------------------------------------------------------------------
# A batch of keys hashed at once: Java's hashCode is Horner's rule over the UTF-16 code
# units, h = 31 * h + unit, mod 2^32. For ASCII keys the units are the bytes, so the keys
# are laid out right-aligned (zero-padded on the left: leading zeros add nothing) as the
# rows of a byte matrix, and Horner's rule runs over the columns, every key at once, in
# 64-bit lanes of one big integer: a handful of C-speed operations per column instead of
# a Python step per character. A lane holds h < 2^32 after masking and grows by at most
# 5 bits and 255 a step, so the mask is applied every 6 columns.
_LANE_MASK_EVERY = 6
_LOW32_LANE = b"\0\0\0\0\xff\xff\xff\xff"


def index_key_hashes(keys: Sequence[bytes], prefix: bytes = b"") -> list[int]:
    """:func:`index_key_hash` of many full keys (``topic#key``) given as UTF-8 bytes,
    invalid sequences read as U+FFFD (as :func:`tide.format.decode_properties` reads
    them): of ``prefix + key`` for each key (``prefix``, such as ``b"topic#"``, shared
    by every key is hashed once). ASCII keys are hashed together (see above), others one
    by one."""
    count = len(keys)
    if not count:
        return []
    if not (prefix.isascii() and b"".join(keys).isascii()):
        return [
            _ascii_hashes([prefix + key])[0]
            if (prefix + key).isascii()
            else index_key_hash((prefix + key).decode("utf-8", "replace"))
            for key in keys
        ]
    return _ascii_hashes(keys, prefix)


def _ascii_hashes(keys: Sequence[bytes], known_prefix: bytes = b"") -> list[int]:
    """Index hashes of ``known_prefix + key`` for ASCII keys. The keys are left-aligned
    in the matrix (zero-padded on the right), so the columns of their common prefix are
    the same for every key: Horner's rule starts from the hash of ``known_prefix`` and
    that common prefix, and runs over the other columns only. The ``p`` zero columns
    after a key multiply its hash by ``31^p``, undone with the inverse of 31 modulo 2^32
    (31 is odd)."""
    count = len(keys)
    lengths = list(map(len, keys))
    width = max(lengths)
    prefix = _common_prefix(min(keys), max(keys)) if count > 1 else keys[0]
    same_length = lengths.count(width) == count
    if same_length:
        matrix = b"".join(keys)
    else:
        matrix = b"".join(map(bytes.ljust, keys, repeat(width), repeat(b"\0")))
    lanes = bytearray(8 * count)
    from_bytes = int.from_bytes
    mask = from_bytes(_LOW32_LANE * count, "big")
    acc = 0
    if prefix or known_prefix:  # one in every lane, times the prefixes' hash
        acc = from_bytes(b"\0\0\0\0\0\0\0\1" * count, "big") * _unsigned_hash(known_prefix + prefix)
    for step, column in enumerate(range(len(prefix), width)):
        lanes[7::8] = matrix[column::width]
        acc = acc * 31 + from_bytes(lanes, "big")
        if step % _LANE_MASK_EVERY == _LANE_MASK_EVERY - 1:
            acc &= mask
    acc &= mask
    lanes = bytearray(acc.to_bytes(8 * count, "big"))
    low = bytearray(4 * count)
    for byte in range(4):
        low[byte::4] = lanes[4 + byte :: 8]
    unsigned = array("I")
    unsigned.frombytes(low)
    if _LITTLE:
        unsigned.byteswap()
    if not same_length:  # undo the padding: times (31^-1)^p, modulo 2^32
        undo = list(map(_inverse_pow31, map(sub, repeat(width), lengths)))
        unsigned = array("I", map(and_, map(mul, unsigned, undo), repeat(_U32)))
    signed = array("i")
    signed.frombytes(unsigned.tobytes())
    hashes = list(map(abs, signed))
    if _INT_MIN_ABS in hashes:  # Math.abs(Integer.MIN_VALUE) stays negative: RocketMQ says 0
        hashes = [0 if h == _INT_MIN_ABS else h for h in hashes]
    return hashes


def _common_prefix(a: bytes, b: bytes) -> bytes:
    size = min(len(a), len(b))
    for index in range(size):
        if a[index] != b[index]:
            return a[:index]
    return a[:size]


def _unsigned_hash(ascii_key: bytes) -> int:
    h = 0
    for unit in ascii_key:
        h = (h * 31 + unit) & _U32
    return h


_U32 = 0xFFFFFFFF
_INVERSE_31 = pow(31, -1, 1 << 32)


@functools.lru_cache(maxsize=4096)
def _inverse_pow31(power: int) -> int:
    return pow(_INVERSE_31, power, 1 << 32)


_INT_MIN_ABS = 1 << 31


def put_keys(
    buf: WritableBuffer,
    geometry: IndexGeometry,
    key_hashes: Sequence[int],
    phy_offsets: Sequence[int],
    store_timestamps_ms: Sequence[int],
    *,
    fd: int | None = None,
) -> int:
    """:func:`put_key` for many keys at once (hashes from :func:`index_key_hashes`);
    returns how many were put, from the first: fewer than given when the file is full.

    ``fd``: the file ``buf`` maps (MAP_SHARED); the entries are then written with
    ``pwrite`` on it rather than through the mapping (the same page cache; a first write
    to a page through the mapping costs a page fault, several times the write).

    The result is exactly that of one ``put_key`` per key, in order, but the header is
    read once and written once, the entries (consecutive numbers) are written with one
    slice assignment, the slots through one typed memoryview. Order of the writes:
    entries, slots, header, as ``put_key`` does for each key (a crash in between leaves
    what ``put_key`` handles: slots naming entries the header does not count yet).
    """
    _check_size(buf, geometry)
    header = read_index_header(buf)
    first = header.index_count
    count = min(len(key_hashes), geometry.max_entries - first)
    if count <= 0:
        return 0
    key_hashes = key_hashes[:count]
    phy_offsets = phy_offsets[:count]
    stamps = store_timestamps_ms[:count]
    slots = list(map(mod, key_hashes, repeat(geometry.slot_count)))
    slot_end = INDEX_HEADER_BYTES + HASH_SLOT_BYTES * geometry.slot_count
    with (
        memoryview(buf) as raw,
        raw[INDEX_HEADER_BYTES:slot_end] as region,
        region.cast("i") as table,  # native byte order: the values read swapped
    ):
        olds = _native_big_endian(list(map(_get_int, repeat(table), slots)))
        distinct = len(set(slots)) == count
        if distinct and min(olds) >= 0 and max(olds) < first:
            # The common case: every slot distinct, holding an older entry or nothing.
            prevs = olds
            fresh_slots = olds.count(INVALID_INDEX)
        else:
            prevs, fresh_slots = _chain_prevs(buf, geometry, slots, olds, first)
        entries = b"".join(
            map(
                _ENTRY.pack,
                key_hashes,
                phy_offsets,
                _time_diffs(header, first, stamps),
                prevs,
            )
        )
        start = geometry.entry_position(first)
        if fd is None:
            buf[start : start + len(entries)] = entries
        elif os.pwrite(fd, entries, start) != len(entries):  # pragma: no cover
            raise OSError(f"short write of {len(entries)} index entry bytes at {start}")
        numbers: Sequence[int] = range(first, first + count)
        if not distinct:  # the last number of a slot wins
            final = dict(zip(slots, numbers, strict=True))
            slots, numbers = list(final.keys()), list(final.values())
        swapped = array("i", numbers)
        if _LITTLE:
            swapped.byteswap()
        for _ in map(_set_int, repeat(table), slots, swapped):
            pass
    head_first = first <= 1
    _HEADER.pack_into(
        buf,
        0,
        stamps[0] if head_first else header.begin_timestamp_ms,
        stamps[-1],
        phy_offsets[0] if head_first else header.begin_phy_offset,
        phy_offsets[-1],
        header.hash_slot_count + fresh_slots,
        first + count,
    )
    return count


def _native_big_endian(values: list[int]) -> list[int]:
    """Swap the bytes of 32-bit ints on a little-endian machine (native <-> big-endian,
    both ways)."""
    if not _LITTLE:
        return values
    swapped = array("i", values)
    swapped.byteswap()
    return swapped.tolist()


def _time_diffs(header: IndexHeader, first: int, stamps: Sequence[int]) -> list[int]:
    """``time_diff_seconds`` of each entry, against the header's begin time, which the
    very first entry of a file sets (for the entries after it)."""
    begin = header.begin_timestamp_ms
    diffs = [time_diff_seconds(stamps[0], begin)]
    if len(stamps) == 1:
        return diffs
    if first <= 1:
        begin = stamps[0]
    if begin <= 0:
        diffs += repeat(0, len(stamps) - 1)
        return diffs
    # Timestamps repeat within a batch (records stored in the same millisecond): each
    # distinct one is computed once.
    if stamps.count(stamps[-1]) == len(stamps) - (stamps[0] != stamps[-1]):
        diffs += repeat(time_diff_seconds(stamps[-1], begin), len(stamps) - 1)
        return diffs
    distinct = set(stamps[1:])
    if len(distinct) * 4 < len(stamps):
        per_stamp = {stamp: time_diff_seconds(stamp, begin) for stamp in distinct}
        diffs += map(per_stamp.__getitem__, stamps[1:])
        return diffs
    rest = list(map(floordiv, map(sub, stamps[1:], repeat(begin)), repeat(1000)))
    if min(rest) < 0 or max(rest) > INT_MAX:  # Java truncates toward zero, then clamps
        rest = [min(max(diff, 0), INT_MAX) for diff in rest]
    diffs += rest
    return diffs


_LITTLE = sys.byteorder == "little"
# ``table[i]`` and ``table[i] = v`` on an int memoryview as functions (in map, about
# twice as fast as the view's ``__getitem__`` / ``__setitem__`` slot wrappers)
_get_int = cast("Callable[[memoryview, int], int]", getitem)
_set_int = cast("Callable[[memoryview, int, int], None]", setitem)


def _chain_prevs(
    buf: WritableBuffer,
    geometry: IndexGeometry,
    slots: Sequence[int],
    olds: Sequence[int],
    first: int,
) -> tuple[list[int], int]:
    """``prev_entry_number`` of each key as sequential ``put_key`` calls would set it (a
    slot used earlier in the batch links to that entry), and how many slots went from
    empty to used."""
    latest: dict[int, int] = {}
    prevs: list[int] = []
    fresh = 0
    for index, (slot, old) in enumerate(zip(slots, olds, strict=True)):
        number = first + index
        earlier = latest.get(slot)
        if earlier is not None:
            prev = earlier
        elif old == number:  # a torn put_key: see put_key
            prev = _ENTRY.unpack_from(buf, geometry.entry_position(number))[3]
            if not INVALID_INDEX < prev < number:
                prev = INVALID_INDEX
        elif old <= INVALID_INDEX or old > number:
            prev = INVALID_INDEX
        else:
            prev = old
        if prev == INVALID_INDEX:
            fresh += 1
        latest[slot] = number
        prevs.append(prev)
    return prevs, fresh

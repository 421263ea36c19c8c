"""The pure-Python reference of the Tail's chunk scan (``tide.format._ccore.scan_v4_run``):
:class:`V4RunScanner` takes the whole, valid V1-magic IPv4 records of a range of the
commitlog in a few passes, each a handful of C-speed operations over the whole range rather
than Python steps per field:

1. the walk: one ``struct.unpack_from`` per record (``total_size`` and the header bytes
   after it), hopping from record to record while the size fits;
2. the header fields of every record at once: the headers are joined and read through
   typed memoryviews with a stride of one header, one strided copy per field (its bytes
   swapped on a little-endian machine: the fields are big-endian), then ``tolist()``;
3. checks over whole columns (``count``, ``min``/``max``, list comparisons, ``set``): V1
   magic, sizes within ``[FIXED_BYTES_V4, max_record_bytes]``, IPv4 hosts,
   ``physical_offset == position``, body lengths that fit;
4. the layout: one slice per record from the topic length to the properties length,
   looked up in a cache (topics repeat) that knows the topic's text (None when it is not
   UTF-8) and the properties length, which must end the record exactly;
5. the body CRC, unless turned off: ``zlib.crc32`` of every body, compared as a list.

The checks are those of :func:`tide.format.scan_record` (plus ``max_record_bytes``); the
scan stops *before* the first record it does not take (tide.tail._batch says what its
caller does with that unit). The compiled twin gives the same answer
(tests/tail/test_ccore_scan.py; docs/performance.md, "The compiled core").
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import add, eq, getitem, sub
from typing import Any, Literal, NamedTuple, cast

from tide.format._columns import ScanColumns
from tide.format._record import (
    BODY_CRC_POS,
    BODY_LENGTH_POS_V4,
    FIXED_BYTES_V4,
    HEADER_V4_BYTES,
    MAGIC_POS,
    MESSAGE_MAGIC_V1,
    PHYSICAL_OFFSET_POS,
    QUEUE_ID_POS,
    QUEUE_OFFSET_POS,
    STORE_TIMESTAMP_POS_V4,
    SYS_FLAG_POS,
    SYSFLAG_HOSTS_V6,
)

HEAD_V4_BYTES = HEADER_V4_BYTES  # the fixed header with IPv4 hosts: the body starts here
_HOSTS_V6 = SYSFLAG_HOSTS_V6
_TOPIC_CACHE_MAX = 4096
# The columns of the answer after the stop and the positions, in order (ScanColumns).
_ANSWER = (
    "offsets",
    "sizes",
    "queue_ids",
    "queue_offsets",
    "flags",
    "stamps",
    "topics",
    "props_starts",
)


class _TopicCache(dict[bytes, str | None]):
    """Topic length byte + topic + properties length -> the topic, or None when it is
    not UTF-8."""

    def __missing__(self, key: bytes) -> str | None:
        if len(self) >= _TOPIC_CACHE_MAX:
            self.clear()
        try:
            topic: str | None = key[1:-2].decode("utf-8")
        except UnicodeDecodeError:
            topic = None
        self[key] = topic
        return topic


class _PropsLengths(dict[bytes, int]):
    """Topic length byte + topic + properties length -> the properties length."""

    def __missing__(self, key: bytes) -> int:
        if len(self) >= _TOPIC_CACHE_MAX:
            self.clear()
        length = self[key] = int.from_bytes(key[-2:], "big")
        return length


def _big_endian_list(words: memoryview) -> list[int]:
    """The integers of a (strided) typed view of big-endian words."""
    if not _LITTLE:
        return words.tolist()
    values = array(words.format, words.tobytes())
    values.byteswap()
    return values.tolist()


def _first_false(flags: Iterable[object]) -> int:
    for index, flag in enumerate(flags):
        if not flag:
            return index
    raise AssertionError("no false flag")  # pragma: no cover - callers know there is one


class _Field(NamedTuple):
    """Where a header field is in the gathered headers, read as native integers: a
    view type code, whether it needs the copy shifted by 4 bytes (8-byte fields at
    positions 4 mod 8), the first element and the step (see ``ChunkScanner._columns``)."""

    code: Literal["i", "I", "q"]
    shifted: bool
    start: int
    step: int


def _field(pos: int, width: int, code: Literal["i", "I", "q"]) -> _Field:
    """The view of one field (at ``pos`` of each 88-byte gathered header) of every record:
    every ``88 / width``-th element of the headers read as ``width``-byte integers, from
    the copy that starts 4 bytes later for an 8-byte field at 4 mod 8. (The fields are
    big-endian: a little-endian machine swaps their bytes afterwards.)"""
    shifted = (pos % width) != 0  # only 8-byte fields at 4 mod 8: read from byte 4 on
    assert not shifted or (width == 8 and pos % 8 == 4), (pos, width)
    first = pos - (4 if shifted else 0)
    assert first % width == 0, (pos, width)
    return _Field(code, shifted, first // width, HEAD_V4_BYTES // width)


_LITTLE = sys.byteorder == "little"
# ``buf[a:b]`` as a function (faster in map than ``buf.__getitem__``, a slot wrapper)
_slice_of = cast("Callable[[bytes, slice], bytes]", getitem)
# The walk keeps 88 bytes from byte 4 of each record (magic .. body_len, then 4 bytes
# it does not use): magic, body_crc, queue_id, queue_offset, physical_offset, sys_flag,
# store_timestamp, body_len at these positions (docs/formats.md, "Message record", - 4).
_COLUMNS = ("magics", "crcs", "queue_ids", "queue_offsets", "phys", "flags", "stamps", "body_lens")
_FIELD_POSITIONS: tuple[tuple[int, int, Literal["i", "I", "q"]], ...] = (
    (MAGIC_POS, 4, "i"),
    (BODY_CRC_POS, 4, "I"),
    (QUEUE_ID_POS, 4, "i"),
    (QUEUE_OFFSET_POS, 8, "q"),
    (PHYSICAL_OFFSET_POS, 8, "q"),
    (SYS_FLAG_POS, 4, "i"),
    (STORE_TIMESTAMP_POS_V4, 8, "q"),
    (BODY_LENGTH_POS_V4, 4, "i"),
)
_FIELDS = tuple(_field(pos - MAGIC_POS, width, code) for pos, width, code in _FIELD_POSITIONS)
# total_size, then the 88 bytes from the magic on (the header less total_size, and 4 more)
_WALK = struct.Struct(f">i{HEADER_V4_BYTES}s")
_V1_BYTES = MESSAGE_MAGIC_V1.to_bytes(4, "big", signed=True)
_WALK_BYTES = _WALK.size  # 92: a record of 91 bytes at the very end is left to scan_record


class V4RunScanner:
    """The reference chunk scan (see the module docstring). One per stream: it keeps a
    cache of decoded topics."""

    def __init__(self, max_record_bytes: int, *, check_crc: bool = True) -> None:
        self.max_record_bytes = max_record_bytes
        self.check_crc = check_crc
        self._topics = _TopicCache()
        self._props_lengths = _PropsLengths()

    def scan(self, buf: bytes, start: int, end: int, base_offset: int, window: int) -> ScanColumns:
        """What ``scan_v4_run(buf, start, end, base_offset, max_record_bytes, check_crc,
        window)`` answers: where the scan stopped, then the columns of the records it took
        (those that start within ``window`` bytes of ``start``); ``buf[0]`` is at
        commitlog offset ``base_offset``."""
        positions, heads, stop = self._walk(buf, start, end, window)
        if not positions:
            return (start, [], [], [], [], [], [], [], [], [])
        cols = self._columns(heads, positions, stop)
        keep = self._check_columns(positions, base_offset, cols)
        if keep:
            keep = self._check_layout(buf, positions, stop, cols, keep)
        if keep and self.check_crc:
            keep = self._check_crcs(buf, positions, cols, keep)
        if not keep:
            return (start, [], [], [], [], [], [], [], [], [])
        del positions[keep:]
        answer = [cols[name][:keep] for name in _ANSWER]
        stop = positions[-1] + answer[1][-1]
        return (stop, positions, *answer)

    @staticmethod
    def _walk(buf: bytes, start: int, end: int, window: int) -> tuple[list[int], bytes, int]:
        """Hop from total_size to total_size while it fits, from ``start`` to ``end``
        (records that start in the first ``window`` bytes): the positions, the headers
        (from byte 4 on, see ``_WALK``) joined, and the end of the last. Anything is
        taken here; the magic is checked on the columns."""
        unpack = _WALK.unpack_from
        positions: list[int] = []
        heads: list[bytes] = []
        add_position = positions.append
        add_head = heads.append
        pos = start
        last = min(end - _WALK_BYTES, start + window)
        smallest = FIXED_BYTES_V4
        while pos <= last:
            size, head = unpack(buf, pos)
            if size < smallest or size > end - pos:
                break
            add_position(pos)
            add_head(head)
            pos += size
        return positions, b"".join(heads), pos

    def _columns(self, heads: bytes, positions: list[int], end: int) -> dict[str, list[Any]]:
        """The header fields of every record as lists, read from the joined headers
        through typed memoryviews with a stride of one header (reversed first on a
        little-endian machine: the fields are big-endian). The body CRCs only when they
        are checked (a batch reads them from the records when asked); the magics only
        when one is not V1 (the usual case is told from the bytes: each of the magic's
        four bytes, with a stride of one header, is that byte of the V1 magic)."""
        count = len(positions)
        skip = {"crcs"} if not self.check_crc else set()
        if all(heads[i::HEAD_V4_BYTES] == _V1_BYTES[i : i + 1] * count for i in range(4)):
            skip.add("magics")  # _check_columns knows they are all V1
        cols: dict[str, list[Any]] = {}
        with memoryview(heads) as whole, whole[4:-4] as shifted:  # (a view: no copy)
            for name, field in zip(_COLUMNS, _FIELDS, strict=True):
                if name not in skip:
                    with (shifted if field.shifted else whole).cast(field.code) as typed:
                        cols[name] = _big_endian_list(typed[field.start :: field.step])
        sizes = list(map(sub, positions[1:], positions))
        sizes.append(end - positions[-1])
        cols["sizes"] = sizes
        return cols

    def _check_columns(
        self, positions: list[int], base_offset: int, cols: dict[str, list[Any]]
    ) -> int:
        """How many records from the first pass the whole-column checks."""
        sizes, flags, body_lens = cols["sizes"], cols["flags"], cols["body_lens"]
        keep = len(positions)
        magics = cols.get("magics")  # none: all V1
        if magics is not None and magics.count(MESSAGE_MAGIC_V1) != keep:
            keep = magics.index(next(m for m in magics if m != MESSAGE_MAGIC_V1))
            if not keep:
                return 0
        if max(sizes) > self.max_record_bytes:
            keep = min(keep, _first_false(s <= self.max_record_bytes for s in sizes))
        bad_flags = {f for f in set(flags) if f & _HOSTS_V6}
        if bad_flags:
            keep = min(keep, _first_false(f not in bad_flags for f in flags))
        offsets = cols["offsets"] = list(map(add, positions, repeat(base_offset)))
        if cols["phys"] != offsets:
            keep = min(keep, _first_false(map(eq, cols["phys"], offsets)))
        # (every body fits when the longest fits the shortest record: no pass per record)
        if min(body_lens) < 0 or (
            max(body_lens) > min(sizes) - FIXED_BYTES_V4
            and min(map(sub, sizes, body_lens)) < FIXED_BYTES_V4
        ):
            keep = min(
                keep,
                _first_false(
                    b >= 0 and s - b >= FIXED_BYTES_V4
                    for s, b in zip(sizes, body_lens, strict=True)
                ),
            )
        return keep

    def _check_layout(
        self, buf: bytes, positions: list[int], end: int, cols: dict[str, list[Any]], keep: int
    ) -> int:
        """Topic length, topic, properties length and properties must fill the record
        exactly; finds the topics and where the properties start."""
        ends = positions[1:keep]
        ends.append(positions[keep - 1] + cols["sizes"][keep - 1])
        # (the body starts at HEAD_V4_BYTES, the topic after it)
        topic_pos = list(
            map(add, positions[:keep], map(add, cols["body_lens"], repeat(HEAD_V4_BYTES)))
        )
        cols["topic_pos"] = topic_pos
        if self._one_topic(buf, topic_pos, ends, cols):
            return keep
        # properties start after the topic length (1 byte), the topic, their length (2)
        props = [tp + 3 + buf[tp] for tp in topic_pos]
        # (a negative one, from a topic length that does not fit, matches no stored one)
        lengths = list(map(sub, ends, props))
        # one slice per record, its length byte, topic and properties length: the key of
        # the topic cache, which also knows the properties length it ends with
        keys: list[bytes] = list(map(_slice_of, repeat(buf), map(slice, topic_pos, props)))
        if list(map(self._props_lengths.__getitem__, keys)) != lengths:
            keep = _first_false(map(eq, map(self._props_lengths.__getitem__, keys), lengths))
            if not keep:
                return 0
            del props[keep:], keys[keep:]
        topics = list(map(self._topics.__getitem__, keys))
        if None in topics:
            keep = topics.index(None)
            del props[keep:], topics[keep:]
        cols["topics"] = topics
        cols["props_starts"] = props
        return len(props)

    def _one_topic(
        self, buf: bytes, topic_pos: list[int], ends: list[int], cols: dict[str, list[Any]]
    ) -> bool:
        """The usual case, every record of one topic, checked without a lookup per record:
        the slices from each topic length byte to the end of the properties length, of
        the same length when the topic is the first record's, are joined and compared
        with what they must be (the first record's topic length byte and topic, then
        each record's properties length, big-endian). False: not all one topic, or a
        record is wrong (the per-record lookups then find which)."""
        count = len(topic_pos)
        first = topic_pos[0]
        width = buf[first] + 3  # length byte, topic, properties length
        props = list(map(add, topic_pos, repeat(width)))
        lengths = list(map(sub, ends, props))
        try:
            big_endian = struct.pack(f">{count}H", *lengths)
        except struct.error:  # a length that does not fit: a record is wrong
            return False
        key = buf[first : first + width]
        topic = self._topics[key]
        if topic is None:
            return False
        expected = bytearray(key) * count
        expected[width - 2 :: width] = big_endian[0::2]
        expected[width - 1 :: width] = big_endian[1::2]
        keys = map(_slice_of, repeat(buf), map(slice, topic_pos, props))
        if b"".join(keys) != expected:
            return False
        cols["topics"] = [topic] * count
        cols["props_starts"] = props
        return True

    @staticmethod
    def _check_crcs(buf: bytes, positions: list[int], cols: dict[str, list[Any]], keep: int) -> int:
        body_starts = map(add, positions[:keep], repeat(HEAD_V4_BYTES))
        bodies = map(_slice_of, repeat(buf), map(slice, body_starts, cols["topic_pos"]))
        computed = list(map(zlib.crc32, bodies))
        crcs = cols["crcs"]
        if computed != crcs[:keep]:
            return _first_false(map(eq, computed, crcs))
        return keep

"""Records a column at a time: :class:`RecordBatch` and the chunk scanner that fills it.

The per-record path (``scan_record`` plus a :class:`RecordAt` per record) costs
microseconds a record in Python; a dispatch replay wants well under one. So
:class:`ChunkScanner` takes the records of a Tail chunk in a few passes, each a handful of
C-speed operations over the whole chunk rather than Python steps per field:

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
5. the body CRC, unless turned off (dispatch does not check it by default, as RocketMQ's
   ReputMessageService does not): ``zlib.crc32`` of every body, compared as a list.

The checks are those of :func:`tide.format.scan_record` (plus ``max_record_bytes``). The
scan stops *before* the first record it does not take: a blank marker, an incomplete or
oversized record, a V2 magic (two-byte topic length), IPv6 hosts, or a record that fails a
check. The caller handles that unit on the per-record path, which accepts it (V2, IPv6),
skips it (blank marker), keeps it for the next chunk (incomplete), or raises with the exact
reason (corruption): the guarantees are the per-record path's, only the common case is
cheaper.
"""

from __future__ import annotations

import contextlib
import gc
import struct
import sys
import threading
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add, eq, getitem, sub
from typing import Any, Literal, NamedTuple, cast

from tide.format import (
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
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_STORE_HOST_V6,
    ScanKind,
    ScanResult,
    _core,
    properties_position,
    record_body_crc,
)

HEAD_V4_BYTES = HEADER_V4_BYTES  # the fixed header with IPv4 hosts: the body starts here
_HOSTS_V6 = SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6
_TOPIC_CACHE_MAX = 4096


class _GcPauses:
    """How many gc_paused() blocks are running, and whether the collector was enabled
    when the first began."""

    lock = threading.Lock()
    running = 0
    was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Keep the cyclic garbage collector from running inside a batch.

    Batch work allocates a few container objects per record (a tuple per regular
    expression match, lists) that live until the batch ends and never form cycles.
    Counted as allocations, they trigger young collections that traverse them and, as
    they survive those, promote them until full collections run over every object of
    the process: measured on a 256 KiB chunk, that was a third of the cost of applying
    it. Nested and concurrent pauses are counted; the collector is enabled again (if it
    was enabled) when the last one ends.
    """
    with _GcPauses.lock:
        _GcPauses.running += 1
        if _GcPauses.running == 1:
            _GcPauses.was_enabled = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _GcPauses.lock:
            _GcPauses.running -= 1
            if _GcPauses.running == 0 and _GcPauses.was_enabled:
                gc.enable()


@dataclass(frozen=True, slots=True)
class RecordAt:
    """One complete, checked record: its commitlog offset, size, scan and bytes."""

    offset: int
    size: int
    scan: ScanResult
    data: bytes

    @property
    def end_offset(self) -> int:
        return self.offset + self.size


class RecordBatch:
    """Complete, checked records in commitlog order, one list per field.

    Record ``i`` is ``data[positions[i] : positions[i] + sizes[i]]``, at commitlog offset
    ``offsets[i]``; its properties are ``data[props_starts[i] : positions[i] + sizes[i]]``.
    The lists are shared, not copied: treat a batch as read-only. Body CRCs are read from
    the records when asked for (:meth:`body_crc`, :attr:`body_crcs`): dispatch needs one
    per batch.
    """

    __slots__ = (
        "data",
        "offsets",
        "positions",
        "props_starts",
        "queue_ids",
        "queue_offsets",
        "sizes",
        "store_timestamps",
        "sys_flags",
        "topics",
    )

    def __init__(
        self,
        data: bytes = b"",
        *,
        positions: list[int] | None = None,
        offsets: list[int] | None = None,
        sizes: list[int] | None = None,
        queue_ids: list[int] | None = None,
        queue_offsets: list[int] | None = None,
        sys_flags: list[int] | None = None,
        store_timestamps: list[int] | None = None,
        topics: list[str] | None = None,
        props_starts: list[int] | None = None,
    ) -> None:
        self.data = data
        self.positions = positions if positions is not None else []
        self.offsets = offsets if offsets is not None else []
        self.sizes = sizes if sizes is not None else []
        self.queue_ids = queue_ids if queue_ids is not None else []
        self.queue_offsets = queue_offsets if queue_offsets is not None else []
        self.sys_flags = sys_flags if sys_flags is not None else []
        self.store_timestamps = store_timestamps if store_timestamps is not None else []
        self.topics = topics if topics is not None else []
        self.props_starts = props_starts if props_starts is not None else []
        n = len(self.positions)
        assert all(
            len(column) == n
            for column in (
                self.offsets,
                self.sizes,
                self.queue_ids,
                self.queue_offsets,
                self.sys_flags,
                self.store_timestamps,
                self.topics,
                self.props_starts,
            )
        ), "columns of different lengths"

    def __len__(self) -> int:
        return len(self.offsets)

    def __bool__(self) -> bool:
        return bool(self.offsets)

    def __repr__(self) -> str:
        if not self.offsets:
            return "RecordBatch(empty)"
        return f"RecordBatch({len(self.offsets)} records, {self.offsets[0]}..{self.end_offset})"

    @property
    def start_offset(self) -> int:
        """Commitlog offset of the first record (the batch must not be empty)."""
        return self.offsets[0]

    @property
    def end_offset(self) -> int:
        """Just past the last record (the batch must not be empty)."""
        return self.offsets[-1] + self.sizes[-1]

    def body_crc(self, index: int) -> int:
        """The body CRC that record ``index`` stores."""
        return record_body_crc(self.data, self.positions[index])

    @property
    def body_crcs(self) -> list[int]:
        """The body CRC of every record (read from the records on each call)."""
        return [self.body_crc(index) for index in range(len(self.positions))]

    def record_bytes(self, index: int) -> bytes:
        start = self.positions[index]
        return self.data[start : start + self.sizes[index]]

    def properties_bytes(self, index: int) -> bytes:
        return self.data[self.props_starts[index] : self.positions[index] + self.sizes[index]]

    def record(self, index: int) -> RecordAt:
        offset, size = self.offsets[index], self.sizes[index]
        scan = ScanResult(
            ScanKind.RECORD,
            size=size,
            queue_id=self.queue_ids[index],
            queue_offset=self.queue_offsets[index],
            physical_offset=offset,
            sys_flag=self.sys_flags[index],
            store_timestamp_ms=self.store_timestamps[index],
            topic=self.topics[index],
        )
        return RecordAt(offset, size, scan, self.record_bytes(index))

    def records(self) -> list[RecordAt]:
        """The records as :class:`RecordAt` objects (the per-record API)."""
        return [self.record(index) for index in range(len(self.offsets))]

    def head(self, count: int) -> RecordBatch:
        """The first ``count`` records."""
        return self.slice(0, count)

    def slice(self, start: int, stop: int) -> RecordBatch:
        """Records ``start`` to ``stop`` (excluded), over the same data."""
        return RecordBatch(
            self.data,
            positions=self.positions[start:stop],
            offsets=self.offsets[start:stop],
            sizes=self.sizes[start:stop],
            queue_ids=self.queue_ids[start:stop],
            queue_offsets=self.queue_offsets[start:stop],
            sys_flags=self.sys_flags[start:stop],
            store_timestamps=self.store_timestamps[start:stop],
            topics=self.topics[start:stop],
            props_starts=self.props_starts[start:stop],
        )

    @classmethod
    def from_records(cls, records: Iterable[RecordAt]) -> RecordBatch:
        """A batch of already checked records (``RecordAt`` from any source)."""
        builder = BatchBuilder()
        for rec in records:
            builder.add_record(rec)
        return builder.build()


class BatchBuilder:
    """Collects scanned runs (from chunk buffers) and single records into one batch."""

    def __init__(self) -> None:
        self._buffers: list[bytes] = []  # each once, in order of first use
        self._buffer_index: dict[int, int] = {}  # id() of a buffer (kept alive above)
        self._runs: list[tuple[int, int]] = []  # (first record, buffer index) per run
        self.batch = RecordBatch()

    def __len__(self) -> int:
        return len(self.batch.offsets)

    def _buffer(self, buf: bytes) -> None:
        """The records added next are in ``buf``."""
        index = self._buffer_index.get(id(buf))
        if index is None:
            index = self._buffer_index[id(buf)] = len(self._buffers)
            self._buffers.append(buf)
        if not self._runs or self._runs[-1][1] != index:
            self._runs.append((len(self.batch.offsets), index))

    def add_record(self, rec: RecordAt) -> None:
        scan = rec.scan
        data = rec.data
        self._buffer(data)
        b = self.batch
        b.positions.append(0)
        b.offsets.append(rec.offset)
        b.sizes.append(rec.size)
        b.queue_ids.append(scan.queue_id)
        b.queue_offsets.append(scan.queue_offset)
        b.sys_flags.append(scan.sys_flag)
        b.store_timestamps.append(scan.store_timestamp_ms)
        b.topics.append(scan.topic)
        b.props_starts.append(properties_position(data))

    def build(self) -> RecordBatch:
        """The batch (positions into one buffer: the chunk itself when it is the only
        one, else the buffers joined, each once). The builder must not be used
        afterwards."""
        b = self.batch
        if len(self._buffers) <= 1:
            b.data = self._buffers[0] if self._buffers else b""
            return b
        b.data = b"".join(self._buffers)
        bases = list(accumulate(map(len, self._buffers), initial=0))
        ends = [first for first, _ in self._runs[1:]]
        ends.append(len(b.offsets))
        for (lo, index), hi in zip(self._runs, ends, strict=True):
            shift = bases[index]
            if shift and hi > lo:
                b.positions[lo:hi] = map(add, b.positions[lo:hi], repeat(shift))
                b.props_starts[lo:hi] = map(add, b.props_starts[lo:hi], repeat(shift))
        return b

    def build_runs(self) -> list[RecordBatch]:
        """The records as batches over their buffers, none joined, when they are in at
        most two runs (a record completed from a carry-over, then the chunk's); else
        :meth:`build`. No batch when there are no records. The builder must not be used
        afterwards."""
        b = self.batch
        if not b.offsets:
            return []
        if len(self._runs) != 2:
            return [self.build()]
        (_, first_buffer), (split, second_buffer) = self._runs
        head = b.head(split)
        head.data = self._buffers[first_buffer]
        for column in _BATCH_COLUMNS:
            del getattr(b, column)[:split]
        b.data = self._buffers[second_buffer]
        return [head, b]


_BATCH_COLUMNS = tuple(name for name in RecordBatch.__slots__ if name != "data")


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
# The columns scan_v4_run returns after the positions, under the names _extend reads.
_C_COLUMNS = (
    "offsets",
    "sizes",
    "queue_ids",
    "queue_offsets",
    "flags",
    "stamps",
    "topics",
    "props_starts",
)
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
# A scan takes the records that start in this window (the next scan goes on from there).
# Scanning a 2 MiB chunk at once, its temporary buffers (the joined headers: ~750 KiB)
# were mapped and faulted in afresh for every chunk: a replay of 500,000 records took
# 21,600 page faults in-process, 3,600 with this window, and ~7 % less CPU.
_WALK_WINDOW = 1024 * 1024


class ChunkScanner:
    """The batch scan of whole records (see the module docstring). One per stream: it
    keeps a cache of decoded topics."""

    def __init__(
        self, max_record_bytes: int, *, check_crc: bool = True, compiled: bool = True
    ) -> None:
        self.max_record_bytes = max_record_bytes
        self.check_crc = check_crc
        self._topics = _TopicCache()
        self._props_lengths = _PropsLengths()
        # The compiled twin of :meth:`scan_python` (tide.format._core), unless turned off
        # (the differential tests compare the two).
        self._compiled = _core.scan_v4_run if compiled else None

    def scan(
        self, buf: bytes, start: int, base_offset: int, out: BatchBuilder, end: int | None = None
    ) -> int:
        """Take the whole, valid V1 IPv4 records from ``buf[start:end]`` (``buf[0]`` is at
        commitlog offset ``base_offset``; ``end`` defaults to the end of ``buf``) into
        ``out``; return where it stopped: ``end`` or the first unit it did not take."""
        end = len(buf) if end is None else end
        if not 0 <= start <= end <= len(buf):
            raise ValueError(
                f"scan: need 0 <= start <= end <= len(buf), got start {start}, end {end}, "
                f"len {len(buf)}"
            )
        if self._compiled is None:
            return self.scan_python(buf, start, base_offset, out, end)
        found = self._compiled(
            buf, start, end, base_offset, self.max_record_bytes, self.check_crc, _WALK_WINDOW
        )
        stop = found[0]
        if stop == start:
            return start
        cols: dict[str, list[Any]] = dict(zip(_C_COLUMNS, found[2:], strict=True))
        self._extend(out, buf, found[1], cols)
        return stop

    def scan_python(
        self, buf: bytes, start: int, base_offset: int, out: BatchBuilder, end: int
    ) -> int:
        """:meth:`scan` in Python: the reference of ``tide.format._ccore.scan_v4_run``."""
        positions, heads, end = self._walk(buf, start, end)
        if not positions:
            return start
        cols = self._columns(heads, positions, end)
        keep = self._check_columns(positions, base_offset, cols)
        if keep:
            keep = self._check_layout(buf, positions, end, cols, keep)
        if keep and self.check_crc:
            keep = self._check_crcs(buf, positions, cols, keep)
        if not keep:
            return start
        if keep < len(positions):
            del positions[keep:]
            for column in cols.values():
                del column[keep:]
        self._extend(out, buf, positions, cols)
        sizes: list[int] = cols["sizes"]
        return positions[-1] + sizes[-1]

    @staticmethod
    def _walk(buf: bytes, start: int, end: int) -> tuple[list[int], bytes, int]:
        """Hop from total_size to total_size while it fits, from ``start`` to ``end``
        (records that start in the window ``_WALK_WINDOW``): the positions, the headers
        (from byte 4 on, see ``_WALK``) joined, and the end of the last. Anything is
        taken here; the magic is checked on the columns."""
        unpack = _WALK.unpack_from
        positions: list[int] = []
        heads: list[bytes] = []
        add_position = positions.append
        add_head = heads.append
        pos = start
        last = min(end - _WALK_BYTES, start + _WALK_WINDOW)
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

    @staticmethod
    def _extend(
        out: BatchBuilder, buf: bytes, positions: list[int], cols: dict[str, list[Any]]
    ) -> None:
        out._buffer(buf)
        b = out.batch
        keep = len(positions)
        fields = (
            ("positions", positions),
            ("offsets", cols["offsets"]),
            ("sizes", cols["sizes"]),
            ("queue_ids", cols["queue_ids"]),
            ("queue_offsets", cols["queue_offsets"]),
            ("sys_flags", cols["flags"]),
            ("store_timestamps", cols["stamps"]),
            ("topics", cols["topics"]),
            ("props_starts", cols["props_starts"]),
        )
        fresh = not b.offsets  # the common case: the batch is this one run
        for name, column in fields:
            if len(column) > keep:
                del column[keep:]
            if fresh:
                setattr(b, name, column)
            else:
                getattr(b, name).extend(column)

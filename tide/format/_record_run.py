"""A record run: whole message records back to back, encoded by a producer-side writer
and checked by the store before it appends them (docs/formats.md, "Record runs").

A run is what ``Storage.Append`` carries in ``records``: the records as they will be in the
commitlog, except the fields only the store knows (queue offset, physical offset, store
timestamp: zeros) and the store host (8 zero bytes, IPv4 layout: the store writes its
own). So the store's per-record work is a layout check and three patches, and the copy
into the segment is one slice assignment per segment.

Writer and reader mirror each other: :class:`RunWriter` builds a run, :func:`scan_run`
walks one and raises :class:`RecordError` naming the record and what is wrong with it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tide.format import _core
from tide.format._columns import PatchedOffsets
from tide.format._record import (
    FIXED_BYTES_V4,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES_V1,
    MAX_TOPIC_BYTES_V2,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    QUEUE_OFFSET_POS,
    RECORD_HEADER_V4,
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_HOSTS_V6,
    SYSFLAG_STORE_HOST_V6,
    RecordError,
    encode_record,
)

# The whole fixed header with an IPv6 born host (writer; RECORD_HEADER_V4 is the IPv4
# one); the fields a reader needs with the others skipped: total_size, magic, body_crc,
# queue_id, sys_flag, body_length.
_HEADER_V6_BORN = struct.Struct(">iiIiiqqiq20sq8siqi")
_CHECKED_V4 = struct.Struct(">iiIi20xi44xi")
_CHECKED_V6_BORN = struct.Struct(">iiIi20xi56xi")
_V4_BYTES = _CHECKED_V4.size  # 88: the body follows
_U16 = struct.Struct(">H")
_OFFSETS = struct.Struct(">qq")  # queue_offset, physical_offset
# store_timestamp and the store host (IPv4, IPv6), patched together
_TIME_AND_HOST = {size: struct.Struct(f">q{size}s") for size in (8, 20)}
_NO_HOST = bytes(8)
_TOPIC_LEN_V1 = [bytes((n,)) for n in range(MAX_TOPIC_BYTES_V1 + 1)]
MAX_RUN_RECORDS = 100_000
_compiled = _core.scan_run  # the twin of scan_run_python, or None (pure-Python path)
_compiled_patch = _core.patch_run  # the twin of patch_run_python, or None
_compiled_encode = _core.encode_run_v4  # the twin of RunWriter.add_many_python, or None
_Key = TypeVar("_Key", bound=Hashable)  # a queue: (topic, queue id) for the store


@dataclass(slots=True)
class RunLayout:
    """The records of a checked run as columns: one entry per record, in order."""

    starts: list[int] = field(default_factory=list)  # each record's position in the run
    sizes: list[int] = field(default_factory=list)
    # UTF-8, not decoded (the store maps them through its topic table); consecutive
    # records of one topic share one bytes object.
    topics: list[bytes] = field(default_factory=list)
    queue_ids: list[int] = field(default_factory=list)
    sys_flags: list[int] = field(default_factory=list)
    # Inside each record: 56, or 68 after an IPv6 born host. The store host follows it.
    store_timestamp_positions: list[int] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.starts)


def topic_part(topic_bytes: bytes) -> tuple[int, bytes]:
    """(magic, the topic with its length) for a topic of 1..32767 UTF-8 bytes."""
    size = len(topic_bytes)
    if not 0 < size <= MAX_TOPIC_BYTES_V2:
        raise ValueError(f"a topic is 1..{MAX_TOPIC_BYTES_V2} bytes, not {size}")
    if size <= MAX_TOPIC_BYTES_V1:
        return MESSAGE_MAGIC_V1, _TOPIC_LEN_V1[size] + topic_bytes
    return MESSAGE_MAGIC_V2, _U16.pack(size) + topic_bytes


@dataclass(slots=True)
class RunWriter:
    """Encodes records of one born host into a run (the gateway's side of ``records``).

    ``born_host`` is packed (8 bytes IPv4, 20 bytes IPv6, see :func:`pack_host`)."""

    born_host: bytes
    _parts: list[bytes] = field(default_factory=list)
    count: int = 0

    def __post_init__(self) -> None:
        assert len(self.born_host) in (8, 20), len(self.born_host)

    def add(
        self,
        topic: str,
        topic_bytes: bytes,
        queue_id: int,
        body: bytes,
        properties: bytes,
        flag: int,
        sys_flag: int,
        born_timestamp_ms: int,
    ) -> None:
        """One record, laid out by :func:`encode_record` with the store's fields zero."""
        assert not sys_flag & (SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6), sys_flag
        if len(self.born_host) != 8:
            sys_flag |= SYSFLAG_BORN_HOST_V6
        record = encode_record(
            topic,
            topic_bytes,
            queue_id,
            body,
            properties,
            flag,
            sys_flag,
            born_timestamp_ms,
            self.born_host,
            _NO_HOST,
        )
        self._parts.append(record.data)
        self.count += 1

    def add_many(
        self,
        magic: int,
        topic_part: bytes,
        queue_ids: Sequence[int],
        bodies: Sequence[bytes],
        properties: Sequence[bytes],
        born_timestamp_ms: int,
    ) -> None:
        """Records of one topic and born time, flag and sys_flag 0: what :meth:`add` gives
        for each (the gateway's common batch), encoded by the compiled core with an IPv4
        born host, else by :meth:`add_many_python`."""
        assert len(queue_ids) == len(bodies) == len(properties)
        assert max(map(len, properties), default=0) <= MAX_PROPERTIES_BYTES
        if _compiled_encode is None or len(self.born_host) != 8:
            self.add_many_python(
                magic, topic_part, queue_ids, bodies, properties, born_timestamp_ms
            )
            return
        self._parts.append(
            _compiled_encode(
                magic, topic_part, queue_ids, bodies, properties, born_timestamp_ms, self.born_host
            )
        )
        self.count += len(bodies)

    def add_many_python(
        self,
        magic: int,
        topic_part: bytes,
        queue_ids: Sequence[int],
        bodies: Sequence[bytes],
        properties: Sequence[bytes],
        born_timestamp_ms: int,
    ) -> None:
        """:meth:`add_many` in Python (its layout is ``encode_record``'s IPv4 /
        IPv6-born-host header, inlined for speed): the reference of
        ``tide.format._ccore.encode_run_v4``."""
        assert len(queue_ids) == len(bodies) == len(properties)
        assert max(map(len, properties), default=0) <= MAX_PROPERTIES_BYTES
        if len(self.born_host) == 8:
            header, fixed = RECORD_HEADER_V4.pack, FIXED_BYTES_V4 - 1 + len(topic_part)
        else:
            header, fixed = _HEADER_V6_BORN.pack, FIXED_BYTES_V4 + 11 + len(topic_part)
        sys_flag = 0 if len(self.born_host) == 8 else SYSFLAG_BORN_HOST_V6
        born_host = self.born_host
        crc32 = zlib.crc32
        u16 = _U16.pack
        extend = self._parts.extend
        for queue_id, body, props in zip(queue_ids, bodies, properties, strict=True):
            body_len = len(body)
            props_len = len(props)
            extend(
                (
                    header(
                        fixed + body_len + props_len,
                        magic,
                        crc32(body),
                        queue_id,
                        0,
                        0,
                        0,
                        sys_flag,
                        born_timestamp_ms,
                        born_host,
                        0,
                        _NO_HOST,
                        0,
                        0,
                        body_len,
                    ),
                    body,
                    topic_part,
                    u16(props_len),
                    props,
                )
            )
        self.count += len(bodies)

    def add_run(self, run: bytes, count: int) -> None:
        """``count`` records already laid out as this writer would (its born host)."""
        self._parts.append(run)
        self.count += count

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


def scan_run(
    data: bytes | bytearray, max_body_bytes: int, max_records: int = MAX_RUN_RECORDS
) -> RunLayout:
    """:func:`scan_run_python` through the compiled core when it runs: its answer when
    the run passes, else the reference's, which names the record and what is wrong."""
    if _compiled is not None:
        found = _compiled(data, max_body_bytes, max_records)
        if found is not None:
            return RunLayout(*found)
    return scan_run_python(data, max_body_bytes, max_records)


def scan_run_python(
    data: bytes | bytearray, max_body_bytes: int, max_records: int = MAX_RUN_RECORDS
) -> RunLayout:
    """Every record of the run ``data``, checked: sizes that add up to the whole run,
    magic, host bits (a producer sets the born host's; the store host is the store's),
    body length within ``max_body_bytes``, topic and properties lengths, body CRC.

    At most ``max_records`` records. What the layout cannot say (the topic exists, the
    queue id is in range, the sys_flag bits are allowed) is the store's to check. The
    hottest loop of a produce on the store's side: one unpack and a few comparisons per
    record, the topic compared in place with the previous record's."""
    layout = RunLayout()
    add_start, add_size = layout.starts.append, layout.sizes.append
    add_topic, add_queue_id = layout.topics.append, layout.queue_ids.append
    add_sys_flag = layout.sys_flags.append
    add_ts_pos = layout.store_timestamp_positions.append
    view = memoryview(data)
    end_of_run = len(data)
    unpack = _CHECKED_V4.unpack_from
    crc32 = zlib.crc32
    starts_with = data.startswith
    topic = b""
    topic_with_length = b"\xff"  # matches no record: the first topic is read
    at = count = 0
    while at < end_of_run:
        if at + _V4_BYTES > end_of_run:
            raise _error(count, at, _what_is_wrong(view, at, end_of_run, max_body_bytes))
        total, magic, crc, queue_id, sys_flag, body_len = unpack(view, at)
        body_pos = at + _V4_BYTES
        if sys_flag & SYSFLAG_HOSTS_V6:  # the general layouts
            header = _header(view, at, end_of_run)
            if header is None or header[4] & SYSFLAG_STORE_HOST_V6:
                raise _error(count, at, _what_is_wrong(view, at, end_of_run, max_body_bytes))
            total, magic, crc, queue_id, sys_flag, body_len, body_pos = header
        end = at + total
        topic_pos = body_pos + body_len
        if magic == MESSAGE_MAGIC_V1 and body_len >= 0 and topic_pos < end <= end_of_run:
            name_pos = topic_pos + 1 + data[topic_pos]
        elif magic == MESSAGE_MAGIC_V2 and body_len >= 0 and topic_pos + 1 < end <= end_of_run:
            name_pos = topic_pos + 2 + (data[topic_pos] << 8 | data[topic_pos + 1])
        else:
            raise _error(count, at, _what_is_wrong(view, at, end_of_run, max_body_bytes))
        # name_pos: here, the position of the properties length
        if (
            body_len > max_body_bytes
            or name_pos + 2 > end
            or name_pos + 2 + (data[name_pos] << 8 | data[name_pos + 1]) != end
            or crc32(view[body_pos:topic_pos]) != crc
            or count >= max_records
        ):
            if count >= max_records:
                raise RecordError(f"more than {max_records} records: split the batch")
            raise _error(count, at, _what_is_wrong(view, at, end_of_run, max_body_bytes))
        if (
            not starts_with(topic_with_length, topic_pos)
            or topic_pos + len(topic_with_length) != name_pos
        ):
            topic_with_length = bytes(view[topic_pos:name_pos])
            topic = topic_with_length[2 if magic == MESSAGE_MAGIC_V2 else 1 :]
            if not topic:
                raise _error(count, at, "the topic is empty")
        add_start(at)
        add_size(total)
        add_topic(topic)
        add_queue_id(queue_id)
        add_sys_flag(sys_flag)
        add_ts_pos(body_pos - at - 32)  # store_timestamp: 32 bytes before the body
        count += 1
        at = end
    return layout


def _header(
    view: memoryview, at: int, end_of_run: int
) -> tuple[int, int, int, int, int, int, int] | None:
    """(total_size, magic, body_crc, queue_id, sys_flag, body_length, body position) of
    the record at ``at``; None when its header does not fit or its magic is wrong."""
    if at + _CHECKED_V4.size > end_of_run:
        return None
    total, magic, crc, queue_id, sys_flag, body_len = _CHECKED_V4.unpack_from(view, at)
    checked = _CHECKED_V4
    if sys_flag & SYSFLAG_BORN_HOST_V6:
        if at + _CHECKED_V6_BORN.size > end_of_run:
            return None
        checked = _CHECKED_V6_BORN
        total, magic, crc, queue_id, sys_flag, body_len = checked.unpack_from(view, at)
    if magic not in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2):
        return None
    return total, magic, crc, queue_id, sys_flag, body_len, at + checked.size


def _error(index: int, at: int, reason: str) -> RecordError:
    return RecordError(f"record {index} of the run (byte {at}): {reason}")


def _what_is_wrong(view: memoryview, at: int, end_of_run: int, max_body_bytes: int) -> str:
    """The first failed check of the record at ``at``, in words (the slow path)."""
    header = _header(view, at, end_of_run)
    if header is None:
        if at + _CHECKED_V4.size > end_of_run:
            return f"{end_of_run - at} bytes left: not a whole record"
        (magic,) = struct.unpack_from(">i", view, at + 4)
        if magic in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2):
            return f"{end_of_run - at} bytes left: not a whole record"
        return f"bad magic 0x{magic & 0xFFFFFFFF:08X}"
    total, magic, crc, _, sys_flag, body_len, body_pos = header
    end = at + total
    if total < FIXED_BYTES_V4 + 1 or end > end_of_run:
        return f"total_size {total} does not fit the {end_of_run - at} bytes left in the run"
    if sys_flag & SYSFLAG_STORE_HOST_V6:
        return "sys_flag sets the store host bit (5): the store host is the store's to set"
    if not 0 <= body_len <= max_body_bytes:
        return f"body length {body_len} is outside 0..{max_body_bytes} (--max-message-body-bytes)"
    topic_pos = body_pos + body_len
    if topic_pos + 2 > end:
        return f"body length {body_len} does not fit total_size {total}"
    if zlib.crc32(view[body_pos:topic_pos]) != crc:
        return "body CRC mismatch"
    return "the topic is empty, or topic and properties lengths do not add up to total_size"


def patch_run(
    data: bytearray | memoryview,
    sizes: Sequence[int],
    queue_keys: Sequence[_Key | None],
    store_timestamp_positions: Sequence[int],
    table: dict[_Key, int],
    physical_offset: int,
    now_ms: int,
    store_host: bytes,
) -> PatchedOffsets:
    """Fill the lock-time fields of every record of a checked run going into one segment
    at ``physical_offset``: its queue offset (``table[key]``, 0 when absent, then moved
    on; 0 and no entry for a key of None), physical offset, store time and store host.
    Returns (physical offsets, queue offsets). The compiled core's when it runs."""
    patch = _compiled_patch if _compiled_patch is not None else patch_run_python
    return patch(
        data,
        sizes,
        queue_keys,
        store_timestamp_positions,
        table,
        physical_offset,
        now_ms,
        store_host,
    )


def patch_run_python(
    data: bytearray | memoryview,
    sizes: Sequence[int],
    queue_keys: Sequence[_Key | None],
    store_timestamp_positions: Sequence[int],
    table: dict[_Key, int],
    physical_offset: int,
    now_ms: int,
    store_host: bytes,
) -> PatchedOffsets:
    """:func:`patch_run` in Python: the reference of ``tide.format._ccore.patch_run``."""
    get_next = table.get
    patch_offsets = _OFFSETS.pack_into
    patch_time_and_host = _TIME_AND_HOST[len(store_host)].pack_into
    physical: list[int] = []
    queue_offsets: list[int] = []
    at = 0
    for size, key, ts_pos in zip(sizes, queue_keys, store_timestamp_positions, strict=True):
        if key is None:
            queue_offset = 0  # transaction prepared/rollback: no queue entry
        else:
            queue_offset = get_next(key, 0)
            table[key] = queue_offset + 1
        patch_offsets(data, at + QUEUE_OFFSET_POS, queue_offset, physical_offset + at)
        patch_time_and_host(data, at + ts_pos, now_ms, store_host)
        physical.append(physical_offset + at)
        queue_offsets.append(queue_offset)
        at += size
    if at != len(data):
        raise ValueError(f"patch_run: the sizes add up to {at}, the run is {len(data)} bytes")
    return physical, queue_offsets


__all__ = [
    "MAX_RUN_RECORDS",
    "RunLayout",
    "RunWriter",
    "patch_run",
    "scan_run",
    "topic_part",
]

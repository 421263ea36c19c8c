"""The commitlog message record (docs/formats.md, "Message record") and the blank marker.

Writer and reader mirror each other:

* :func:`encode_record` builds a whole record *outside* the append lock, with zeros in the
  three fields only the lock holder knows (queue offset, physical offset, store time);
* :func:`patch_record` fills those three fields in place, under the lock;
* :func:`scan_record` walks records cheaply (recovery, verify, dispatch) and
  :func:`decode_record` decodes every field.

Every integer is big-endian. With IPv4 hosts a record is ``91 + body + topic + properties``
bytes long.
"""

from __future__ import annotations

import enum
import mmap
import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

from tide.format import _core
from tide.format._hosts import HostAddress, unpack_host
from tide.format._properties import decode_properties

MESSAGE_MAGIC_V1 = -626843481  # 0xDAA320A7: 1-byte topic length
MESSAGE_MAGIC_V2 = -626843477  # 0xDAA320AB: 2-byte topic length
BLANK_MAGIC = -875286124  # 0xCBD43194: end of segment

# Anything records can be read from: a segment's mmap, a file's bytes, a buffer.
Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap

# sys_flag bits
SYSFLAG_COMPRESSED = 1 << 0
SYSFLAG_MULTI_TAGS = 1 << 1
SYSFLAG_TRANSACTION_MASK = 3 << 2
SYSFLAG_TRANSACTION_NOT_TYPE = 0
SYSFLAG_TRANSACTION_PREPARED = 1 << 2
SYSFLAG_TRANSACTION_COMMIT = 2 << 2
SYSFLAG_TRANSACTION_ROLLBACK = 3 << 2
SYSFLAG_BORN_HOST_V6 = 1 << 4
SYSFLAG_STORE_HOST_V6 = 1 << 5
# The bits a producer may set (compressed, multi tags, transaction type: 0-3; bits 8-10,
# RocketMQ's); a copy the broker writes of a stored message keeps only these.
SYSFLAG_PRODUCER_MASK = 0b111_0000_1111

MAX_TOPIC_BYTES_V1 = 127
MAX_TOPIC_BYTES_V2 = 32767
MAX_PROPERTIES_BYTES = 32767
BLANK_MARKER_BYTES = 8
# total_size, magic, body_crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
# born_timestamp: the part of the header before the first host.
_PREFIX = struct.Struct(">iiIiiqqiq")
PREFIX_BYTES = _PREFIX.size  # 48
# Where the header fields start (docs/formats.md, "Message record"): the only copy of
# these positions (tests/test_layout_in_one_place.py). The ones after the born host hold
# for IPv4 hosts (``_V4``); body_length_pos / store_timestamp_pos give them for any.
MAGIC_POS = 4
BODY_CRC_POS = 8
QUEUE_ID_POS = 12
QUEUE_OFFSET_POS = 20  # queue_offset and physical_offset are adjacent: patched together
PHYSICAL_OFFSET_POS = 28
SYS_FLAG_POS = 36
BORN_HOST_POS = 48
STORE_TIMESTAMP_POS_V4 = 56
BODY_LENGTH_POS_V4 = 84
_OFFSETS = struct.Struct(">qq")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
# total_size and magic: how every unit (record or blank marker) starts
RECORD_HEAD = struct.Struct(">ii")
_BLANK = RECORD_HEAD
# The fixed part of a record: everything except body, topic and properties bytes.
FIXED_BYTES_V4 = 91


def _tail_struct(born_len: int, store_len: int) -> struct.Struct:
    # born_host, store_timestamp, store_host, reconsume_times, prepared_tx_offset, body_len
    return struct.Struct(f">{born_len}sq{store_len}siqi")


_TAILS = {(b, s): _tail_struct(b, s) for b in (8, 20) for s in (8, 20)}
# The common case (IPv4 everywhere) as one struct for the whole fixed header, from
# total_size to body_length; the body follows. Writers and fast readers share it.
RECORD_HEADER_V4 = struct.Struct(">iiIiiqqiq8sq8siqi")
HEADER_V4_BYTES = RECORD_HEADER_V4.size  # 88
# Either host is IPv6 (20 bytes): the header is not RECORD_HEADER_V4.
SYSFLAG_HOSTS_V6 = SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6
_STORE_TS_POS_V4 = STORE_TIMESTAMP_POS_V4
assert _STORE_TS_POS_V4 == PREFIX_BYTES + 8 and BORN_HOST_POS == PREFIX_BYTES
_TOPIC_LEN_V1 = [bytes((n,)) for n in range(MAX_TOPIC_BYTES_V1 + 1)]
# encode_record's callables, one global lookup each (it runs once a record)
_pack_header_v4 = RECORD_HEADER_V4.pack
_pack_u16 = _U16.pack
_crc32 = zlib.crc32


def host_length(sys_flag: int, bit: int) -> int:
    return 20 if sys_flag & bit else 8


def record_size(body_len: int, topic_len: int, props_len: int, sys_flag: int = 0) -> int:
    """Total size of a record with these variable parts (host sizes from ``sys_flag``)."""
    topic_len_bytes = 1 if topic_len <= MAX_TOPIC_BYTES_V1 else 2
    born = host_length(sys_flag, SYSFLAG_BORN_HOST_V6)
    store = host_length(sys_flag, SYSFLAG_STORE_HOST_V6)
    return (
        PREFIX_BYTES + born + 8 + store + 4 + 8 + 4 + body_len + topic_len_bytes + topic_len + 2
    ) + props_len


def store_timestamp_pos(sys_flag: int) -> int:
    """Offset of store_timestamp inside a record (after the variable-size born host)."""
    return PREFIX_BYTES + host_length(sys_flag, SYSFLAG_BORN_HOST_V6)


def body_length_pos(sys_flag: int) -> int:
    """Offset of BODYLENGTH inside a record; the body follows it (after both hosts)."""
    return (
        PREFIX_BYTES
        + host_length(sys_flag, SYSFLAG_BORN_HOST_V6)
        + 8
        + host_length(sys_flag, SYSFLAG_STORE_HOST_V6)
        + 12
    )


def is_queue_less(sys_flag: int) -> bool:
    """Transaction prepared/rollback records take no queue offset (RocketMQ's rule)."""
    tx = sys_flag & SYSFLAG_TRANSACTION_MASK
    return tx in (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)


class EncodedRecord(NamedTuple):
    """A record encoded outside the lock; ``data`` lacks the three lock-time fields."""

    data: bytes
    topic: str
    queue_id: int
    sys_flag: int
    store_timestamp_pos: int


def encode_record(
    topic: str,
    topic_bytes: bytes,
    queue_id: int,
    body: bytes,
    properties_bytes: bytes,
    flag: int,
    sys_flag: int,
    born_timestamp_ms: int,
    born_host: bytes,
    store_host: bytes,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
) -> EncodedRecord:
    """Encode one record (the hot path: keep it lean): tide.format's one encoder of a
    record in Python, called record by record by the store's codec (field-per-message
    Appends) and the producer-side :class:`RunWriter` (docs/performance.md, "One place
    knows each layout").

    Hosts are packed (see :func:`tide.format.pack_host`); the IPv6 bits of ``sys_flag``
    must agree with their lengths. Validation of user input is the caller's job; the
    layout invariants are asserted here and again by the reader.
    """
    topic_len = len(topic_bytes)
    props_len = len(properties_bytes)
    assert 0 < topic_len <= MAX_TOPIC_BYTES_V2 and props_len <= MAX_PROPERTIES_BYTES
    if topic_len <= MAX_TOPIC_BYTES_V1:
        magic = MESSAGE_MAGIC_V1
        topic_length = _TOPIC_LEN_V1[topic_len]
        fixed_and_topic = FIXED_BYTES_V4 + topic_len  # (its 1-byte length counted in)
    else:
        magic = MESSAGE_MAGIC_V2
        topic_length = _pack_u16(topic_len)
        fixed_and_topic = FIXED_BYTES_V4 + 1 + topic_len
    body_len = len(body)
    if len(born_host) == 8 and len(store_host) == 8:
        assert not sys_flag & SYSFLAG_HOSTS_V6
        size = fixed_and_topic + body_len + props_len
        header = _pack_header_v4(
            size,
            magic,
            _crc32(body),
            queue_id,
            flag,
            0,
            0,
            sys_flag,
            born_timestamp_ms,
            born_host,
            0,
            store_host,
            reconsume_times,
            prepared_transaction_offset,
            body_len,
        )
        ts_pos = _STORE_TS_POS_V4
    else:
        assert len(born_host) == host_length(sys_flag, SYSFLAG_BORN_HOST_V6)
        assert len(store_host) == host_length(sys_flag, SYSFLAG_STORE_HOST_V6)
        size = record_size(body_len, topic_len, props_len, sys_flag)
        header = _PREFIX.pack(
            size, magic, zlib.crc32(body), queue_id, flag, 0, 0, sys_flag, born_timestamp_ms
        ) + _TAILS[len(born_host), len(store_host)].pack(
            born_host, 0, store_host, reconsume_times, prepared_transaction_offset, body_len
        )
        ts_pos = store_timestamp_pos(sys_flag)
    data = b"".join(
        (header, body, topic_length, topic_bytes, _pack_u16(props_len), properties_bytes)
    )
    assert len(data) == size
    return EncodedRecord(data, topic, queue_id, sys_flag, ts_pos)


def patch_record(
    buf: bytearray | memoryview | mmap.mmap,
    pos: int,
    ts_pos: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp_ms: int,
) -> None:
    """Fill the lock-time fields of the record written at ``buf[pos:]``."""
    _OFFSETS.pack_into(buf, pos + QUEUE_OFFSET_POS, queue_offset, physical_offset)
    _I64.pack_into(buf, pos + ts_pos, store_timestamp_ms)


def write_blank(buf: bytearray | memoryview | mmap.mmap, pos: int, bytes_left: int) -> None:
    """Write the end-of-segment marker: ``total_size = bytes_left, magic = BLANK``."""
    assert bytes_left >= BLANK_MARKER_BYTES, bytes_left
    _BLANK.pack_into(buf, pos, bytes_left, BLANK_MAGIC)


class ScanKind(enum.Enum):
    RECORD = "record"
    BLANK = "blank"  # end-of-segment marker: continue at the next segment
    END = "end"  # total_size 0: nothing written here yet
    INVALID = "invalid"  # not a record: torn tail or corruption, the caller decides


@dataclass(frozen=True, slots=True)
class ScanResult:
    kind: ScanKind
    size: int = 0
    reason: str = ""
    # Set for RECORD: what recovery and dispatch need without a full decode.
    queue_id: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    store_timestamp_ms: int = 0
    topic: str = ""


def _invalid(reason: str) -> ScanResult:
    return ScanResult(ScanKind.INVALID, reason=reason)


def scan_record(
    buf: Buffer,
    pos: int,
    limit: int,
    *,
    expected_offset: int | None = None,
    check_crc: bool = True,
    max_body_bytes: int = 1 << 30,
) -> ScanResult:
    """Look at the bytes at ``buf[pos:limit]`` and say what is there.

    ``expected_offset`` is the commitlog offset of ``pos``; when given, the record's
    physical_offset field must equal it. Checks: magic, sizes consistent with the layout,
    body CRC (``check_crc``), topic UTF-8.
    """
    view = memoryview(buf)
    avail = limit - pos
    if avail < BLANK_MARKER_BYTES:
        if avail <= 0 or not any(view[pos:limit]):
            return ScanResult(ScanKind.END)
        return _invalid(f"{avail} stray bytes at the end of the segment")
    total_size, magic = _BLANK.unpack_from(view, pos)
    if total_size == 0 and magic == 0:
        return ScanResult(ScanKind.END)
    if magic == BLANK_MAGIC:
        if total_size != avail:
            return _invalid(f"blank marker says {total_size} bytes left, segment has {avail}")
        return ScanResult(ScanKind.BLANK, size=total_size)
    if magic not in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2):
        return _invalid(f"bad magic 0x{magic & 0xFFFFFFFF:08X} (total_size {total_size})")
    if total_size < FIXED_BYTES_V4 or total_size > avail:
        return _invalid(f"total_size {total_size} outside [{FIXED_BYTES_V4}, {avail}]")
    return _scan_message(view, pos, total_size, magic, expected_offset, check_crc, max_body_bytes)


def _scan_message(
    view: memoryview,
    pos: int,
    total_size: int,
    magic: int,
    expected_offset: int | None,
    check_crc: bool,
    max_body_bytes: int,
) -> ScanResult:
    _, _, crc, queue_id, _, queue_offset, physical_offset, sys_flag, _ = _PREFIX.unpack_from(
        view, pos
    )
    born_len = host_length(sys_flag, SYSFLAG_BORN_HOST_V6)
    store_len = host_length(sys_flag, SYSFLAG_STORE_HOST_V6)
    tail = _TAILS[born_len, store_len]
    if PREFIX_BYTES + tail.size > total_size:
        return _invalid(f"total_size {total_size} too small for the hosts")
    _, store_ts, _, _, _, body_len = tail.unpack_from(view, pos + PREFIX_BYTES)
    body_pos = pos + PREFIX_BYTES + tail.size
    end = pos + total_size
    if body_len < 0 or body_len > max_body_bytes or body_pos + body_len > end:
        return _invalid(f"body length {body_len} does not fit total_size {total_size}")
    topic_pos = body_pos + body_len
    len_bytes = 1 if magic == MESSAGE_MAGIC_V1 else 2
    if topic_pos + len_bytes > end:
        return _invalid("record ends inside the topic length")
    topic_len = view[topic_pos] if len_bytes == 1 else _U16.unpack_from(view, topic_pos)[0]
    props_len_pos = topic_pos + len_bytes + topic_len
    if props_len_pos + 2 > end:
        return _invalid(f"topic length {topic_len} does not fit total_size {total_size}")
    (props_len,) = _U16.unpack_from(view, props_len_pos)
    if props_len_pos + 2 + props_len != end:
        return _invalid(
            f"field lengths add up to {props_len_pos + 2 + props_len - pos}, "
            f"total_size says {total_size}"
        )
    if expected_offset is not None and physical_offset != expected_offset:
        return _invalid(f"physical_offset field {physical_offset} != position {expected_offset}")
    if check_crc and zlib.crc32(view[body_pos:topic_pos]) != crc:
        return _invalid("body CRC mismatch")
    try:
        topic = bytes(view[topic_pos + len_bytes : props_len_pos]).decode("utf-8")
    except UnicodeDecodeError:
        return _invalid("topic is not UTF-8")
    return ScanResult(
        ScanKind.RECORD,
        size=total_size,
        queue_id=queue_id,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        sys_flag=sys_flag,
        store_timestamp_ms=store_ts,
        topic=topic,
    )


DEFAULT_MAX_BODY_BYTES = 1 << 30  # scan_record's default bound on a body


def replay_records(
    buf: Buffer,
    pos: int,
    limit: int,
    base_offset: int,
    next_offsets: dict[tuple[str, int], int],
    *,
    check_crc: bool = True,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> tuple[int, int]:
    """Walk the records from ``buf[pos:limit]`` (``buf[0]`` at commitlog offset
    ``base_offset``) while :func:`scan_record` calls them records, and raise each queue's
    next offset in ``next_offsets`` past theirs (recovery's replay; records without a
    queue entry, see :func:`is_queue_less`, skipped). Returns (the position of the first
    unit that is not a record, how many records were walked): the caller asks
    :func:`scan_record` what is there. The compiled core's when it runs."""
    if _compiled_replay is not None:
        return _compiled_replay(
            buf, pos, limit, base_offset, check_crc, max_body_bytes, next_offsets
        )
    return replay_records_python(
        buf,
        pos,
        limit,
        base_offset,
        next_offsets,
        check_crc=check_crc,
        max_body_bytes=max_body_bytes,
    )


def replay_records_python(
    buf: Buffer,
    pos: int,
    limit: int,
    base_offset: int,
    next_offsets: dict[tuple[str, int], int],
    *,
    check_crc: bool = True,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> tuple[int, int]:
    """:func:`replay_records` in Python: the reference of
    ``tide.format._ccore.replay_records``."""
    if pos < 0 or limit > len(buf):
        raise ValueError(
            f"replay_records: need 0 <= pos and limit <= len(buf), got pos {pos}, "
            f"limit {limit}, len {len(buf)}"
        )
    count = 0
    while True:
        scan = scan_record(
            buf,
            pos,
            limit,
            expected_offset=base_offset + pos,
            check_crc=check_crc,
            max_body_bytes=max_body_bytes,
        )
        if scan.kind is not ScanKind.RECORD:
            return pos, count
        if not is_queue_less(scan.sys_flag):
            key = (scan.topic, scan.queue_id)
            if scan.queue_offset + 1 > next_offsets.get(key, 0):
                next_offsets[key] = scan.queue_offset + 1
        count += 1
        pos += scan.size


_compiled_replay = _core.replay_records  # the twin of replay_records_python, or None


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    """Every field of a message record."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: HostAddress
    store_timestamp_ms: int
    store_host: HostAddress
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]


class RecordError(ValueError):
    """The bytes at an offset are not a valid record."""


def decode_record(
    buf: Buffer,
    pos: int,
    limit: int,
    *,
    expected_offset: int | None = None,
    check_crc: bool = True,
) -> DecodedRecord:
    """Decode the record at ``buf[pos:]``; raise :class:`RecordError` if there is none."""
    view = memoryview(buf)
    scan = scan_record(view, pos, limit, expected_offset=expected_offset, check_crc=check_crc)
    if scan.kind is not ScanKind.RECORD:
        raise RecordError(scan.reason or f"no message record here ({scan.kind.value})")
    size, magic, crc, queue_id, flag, q_off, p_off, sys_flag, born_ts = _PREFIX.unpack_from(
        view, pos
    )
    tail = _TAILS[
        host_length(sys_flag, SYSFLAG_BORN_HOST_V6), host_length(sys_flag, SYSFLAG_STORE_HOST_V6)
    ]
    born, store_ts, store, reconsume, prepared, body_len = tail.unpack_from(
        view, pos + PREFIX_BYTES
    )
    body_pos = pos + PREFIX_BYTES + tail.size
    topic_pos = body_pos + body_len
    len_bytes = 1 if magic == MESSAGE_MAGIC_V1 else 2
    props_pos = topic_pos + len_bytes + len(scan.topic.encode("utf-8")) + 2
    record = DecodedRecord(
        total_size=size,
        magic=magic,
        body_crc=crc,
        queue_id=queue_id,
        flag=flag,
        queue_offset=q_off,
        physical_offset=p_off,
        sys_flag=sys_flag,
        born_timestamp_ms=born_ts,
        born_host=unpack_host(born),
        store_timestamp_ms=store_ts,
        store_host=unpack_host(store),
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body=bytes(view[body_pos:topic_pos]),
        topic=scan.topic,
        properties=decode_properties(bytes(view[props_pos : pos + size])),
    )
    assert props_pos <= pos + size
    return record


TOTAL_SIZE_BYTES = _I32.size  # the TOTALSIZE field, first in every record and blank


def record_total_size(buf: Buffer, pos: int) -> int:
    """The TOTALSIZE field of the record (or blank marker) at ``buf[pos:]``, unchecked."""
    size: int = _I32.unpack_from(buf, pos)[0]
    return size


def record_body_crc(buf: Buffer, pos: int) -> int:
    """The body CRC the record at ``buf[pos:]`` stores."""
    crc: int = _U32.unpack_from(buf, pos + BODY_CRC_POS)[0]
    return crc


def properties_position(buf: Buffer, pos: int = 0) -> int:
    """Where the properties of the (already checked) record at ``buf[pos:]`` start."""
    magic = _I32.unpack_from(buf, pos + MAGIC_POS)[0]
    sys_flag = int(buf[pos + SYS_FLAG_POS + 3])  # (the host bits are in its low byte)
    body_len_pos = pos + body_length_pos(sys_flag)
    body_len: int = _I32.unpack_from(buf, body_len_pos)[0]
    topic_pos = body_len_pos + 4 + body_len
    if magic == MESSAGE_MAGIC_V2:
        topic_len: int = _U16.unpack_from(buf, topic_pos)[0]
        return topic_pos + 2 + topic_len + 2
    return topic_pos + 1 + int(buf[topic_pos]) + 2


def record_properties(buf: Buffer, pos: int, size: int) -> dict[str, str]:
    """The properties of the (already scanned) record at ``buf[pos:pos+size]``, read
    through the length fields without decoding the rest (dispatch's hot path)."""
    return record_topic_and_properties(buf, pos, size)[1]


def record_topic_and_properties(buf: Buffer, pos: int, size: int) -> tuple[str, dict[str, str]]:
    """The topic and properties of the (already scanned) record at ``buf[pos:pos+size]``,
    read through the length fields without decoding the body or checking its CRC."""
    view = memoryview(buf)
    sys_flag = _I32.unpack_from(view, pos + SYS_FLAG_POS)[0]
    body_len_pos = pos + body_length_pos(sys_flag)
    topic_len_pos = body_len_pos + 4 + _I32.unpack_from(view, body_len_pos)[0]
    if _I32.unpack_from(view, pos + MAGIC_POS)[0] == MESSAGE_MAGIC_V1:
        topic_pos = topic_len_pos + 1
        props_len_pos = topic_pos + view[topic_len_pos]
    else:
        topic_pos = topic_len_pos + 2
        props_len_pos = topic_pos + _U16.unpack_from(view, topic_len_pos)[0]
    props_end = props_len_pos + 2 + _U16.unpack_from(view, props_len_pos)[0]
    if props_end != pos + size:
        raise RecordError(f"record at {pos}: fields end at {props_end - pos}, size is {size}")
    topic = bytes(view[topic_pos:props_len_pos]).decode("utf-8", errors="replace")
    return topic, decode_properties(bytes(view[props_len_pos + 2 : props_end]))

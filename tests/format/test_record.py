"""The message record layout: writer and reader mirror each other."""

from __future__ import annotations

import struct
import zlib

import pytest

from tide.format import (
    BLANK_MAGIC,
    FIXED_BYTES_V4,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_STORE_HOST_V6,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    EncodedRecord,
    HostAddress,
    RecordError,
    ScanKind,
    decode_record,
    encode_properties,
    encode_record,
    is_queue_less,
    pack_host,
    patch_record,
    record_properties,
    record_size,
    record_topic_and_properties,
    scan_record,
    write_blank,
)

V4 = pack_host(HostAddress("10.0.0.7", 10911))
V6 = pack_host(HostAddress("2001:db8::1", 10911))


def _encode(
    body: bytes = b"hello",
    topic: str = "TopicTest",
    props: dict[str, str] | None = None,
    sys_flag: int = 0,
    born: bytes = V4,
    store: bytes = V4,
) -> EncodedRecord:
    return encode_record(
        topic, topic.encode(), 3, body, encode_properties(props or {}), 7, sys_flag, 1_000,
        born, store, 2, 99,
    )  # fmt: skip


def _placed(rec: EncodedRecord, at: int = 0, room: int = 0) -> bytearray:
    buf = bytearray(at + len(rec.data) + room)
    buf[at : at + len(rec.data)] = rec.data
    patch_record(buf, at, rec.store_timestamp_pos, 41, 5_000 + at, 2_000)
    return buf


def test_worked_example_layout_is_byte_exact() -> None:
    """The worked example of docs/formats.md, field by field."""
    rec = _encode(body=b"hello", topic="TopicTest", props={"TAGS": "TagA"})
    buf = _placed(rec)
    props = b"TAGS\x01TagA\x02"
    assert len(buf) == FIXED_BYTES_V4 + 5 + 9 + len(props) == 115
    expected = b"".join(
        [
            struct.pack(">iiIiiqqiq", 115, MESSAGE_MAGIC_V1, zlib.crc32(b"hello"), 3, 7, 41,
                        5_000, 0, 1_000),
            V4,
            struct.pack(">q", 2_000),
            V4,
            struct.pack(">iqi", 2, 99, 5),
            b"hello",
            bytes([9]) + b"TopicTest",
            struct.pack(">H", len(props)) + props,
        ]
    )  # fmt: skip
    assert bytes(buf) == expected
    assert buf[4:8] == bytes.fromhex("DAA320A7")


def test_decode_mirrors_encode() -> None:
    rec = _encode(body=b"\x00\xffbody", props={"KEYS": "k1 k2", "a": "b"})
    buf = _placed(rec, at=16)
    got = decode_record(buf, 16, len(buf), expected_offset=5_016)
    assert (got.topic, got.queue_id, got.body, got.flag) == ("TopicTest", 3, b"\x00\xffbody", 7)
    assert (got.queue_offset, got.physical_offset, got.store_timestamp_ms) == (41, 5_016, 2_000)
    assert (got.born_timestamp_ms, got.reconsume_times, got.prepared_transaction_offset) == (
        1_000, 2, 99,
    )  # fmt: skip
    assert got.born_host == HostAddress("10.0.0.7", 10911) == got.store_host
    assert got.properties == {"KEYS": "k1 k2", "a": "b"}
    assert got.body_crc == zlib.crc32(b"\x00\xffbody")
    assert got.total_size == len(rec.data) == record_size(6, 9, len(b"KEYS\x01k1 k2\x02a\x01b\x02"))


def test_ipv6_hosts_set_flags_and_lengths() -> None:
    flags = SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6
    rec = _encode(sys_flag=flags, born=V6, store=V6)
    assert len(rec.data) == FIXED_BYTES_V4 + 24 + 5 + 9
    got = decode_record(_placed(rec), 0, len(rec.data))
    assert got.born_host == HostAddress("2001:db8::1", 10911) == got.store_host
    assert got.store_timestamp_ms == 2_000


def test_mixed_host_families() -> None:
    rec = _encode(sys_flag=SYSFLAG_BORN_HOST_V6, born=V6, store=V4)
    got = decode_record(_placed(rec), 0, len(rec.data))
    assert got.born_host.is_v6 and not got.store_host.is_v6


def test_long_topic_uses_magic_v2() -> None:
    topic = "t" * 200
    rec = _encode(topic=topic)
    assert struct.unpack_from(">i", rec.data, 4)[0] == MESSAGE_MAGIC_V2
    assert decode_record(_placed(rec), 0, len(rec.data)).topic == topic


def test_topic_of_127_bytes_still_uses_magic_v1() -> None:
    rec = _encode(topic="t" * 127)
    assert struct.unpack_from(">i", rec.data, 4)[0] == MESSAGE_MAGIC_V1


def test_crc_mismatch_is_invalid() -> None:
    buf = _placed(_encode())
    buf[90] ^= 0xFF  # inside the body (the header is 88 bytes)
    scan = scan_record(buf, 0, len(buf))
    assert scan.kind is ScanKind.INVALID and "CRC" in scan.reason
    assert scan_record(buf, 0, len(buf), check_crc=False).kind is ScanKind.RECORD
    with pytest.raises(RecordError, match="CRC"):
        decode_record(buf, 0, len(buf))


def test_wrong_physical_offset_is_invalid() -> None:
    buf = _placed(_encode())
    scan = scan_record(buf, 0, len(buf), expected_offset=123)
    assert scan.kind is ScanKind.INVALID and "physical_offset" in scan.reason


def test_zero_bytes_are_the_end() -> None:
    assert scan_record(bytes(64), 0, 64).kind is ScanKind.END
    assert scan_record(bytes(4), 0, 4).kind is ScanKind.END


def test_blank_marker() -> None:
    buf = bytearray(100)
    write_blank(buf, 40, 60)
    assert struct.unpack_from(">ii", buf, 40) == (60, BLANK_MAGIC)
    scan = scan_record(buf, 40, 100)
    assert (scan.kind, scan.size) == (ScanKind.BLANK, 60)
    assert scan_record(buf, 40, 120).kind is ScanKind.INVALID  # size disagrees with the room


def test_torn_record_is_invalid_not_a_crash() -> None:
    data = _placed(_encode(body=b"x" * 300))
    torn = bytes(data[:150]) + bytes(200)
    scan = scan_record(torn, 0, len(torn))
    assert scan.kind is ScanKind.INVALID


def test_truncated_record_longer_than_the_buffer() -> None:
    data = _placed(_encode(body=b"x" * 300))
    scan = scan_record(data[:200], 0, 200)
    assert scan.kind is ScanKind.INVALID and "total_size" in scan.reason


def test_bad_magic() -> None:
    data = _placed(_encode())
    data[4:8] = b"\x01\x02\x03\x04"
    assert "bad magic" in scan_record(data, 0, len(data)).reason


def test_field_lengths_must_add_up() -> None:
    data = _placed(_encode(props={"a": "b"}))
    struct.pack_into(">H", data, len(data) - 6, 3)  # a props length one byte short
    assert scan_record(data, 0, len(data)).kind is ScanKind.INVALID


@pytest.mark.parametrize(
    ("flag", "queue_less"),
    [
        (0, False),
        (SYSFLAG_TRANSACTION_PREPARED, True),
        (SYSFLAG_TRANSACTION_COMMIT, False),
        (SYSFLAG_TRANSACTION_ROLLBACK, True),
    ],
)
def test_transaction_types_without_queue_offset(flag: int, queue_less: bool) -> None:
    assert is_queue_less(flag) is queue_less


@pytest.mark.parametrize(
    ("topic", "flags", "born", "store"),
    [
        ("TopicTest", 0, V4, V4),
        ("t" * 200, 0, V4, V4),
        ("TopicTest", SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6, V6, V6),
    ],
    ids=["v4", "long-topic-v2", "ipv6"],
)
def test_record_properties_reads_only_the_properties(
    topic: str, flags: int, born: bytes, store: bytes
) -> None:
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "U"}
    buf = _placed(_encode(topic=topic, props=props, sys_flag=flags, born=born, store=store), 7)
    assert record_properties(buf, 7, len(buf) - 7) == props
    assert record_topic_and_properties(buf, 7, len(buf) - 7) == (topic, props)
    with pytest.raises(RecordError, match="size is"):
        record_properties(buf, 7, len(buf) - 8)

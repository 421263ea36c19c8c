"""Record runs (docs/formats.md, "Record runs"): the producer-side writer and the store's
scan mirror each other, and every broken layout is reported with the record it is in."""

from __future__ import annotations

import struct
import zlib

import pytest

from tide.format import (
    MAX_TOPIC_BYTES_V1,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_STORE_HOST_V6,
    HostAddress,
    RecordError,
    RunWriter,
    decode_record,
    encode_properties,
    encode_record,
    pack_host,
    patch_record,
    scan_run,
    topic_part,
)

V4 = pack_host(HostAddress("10.0.0.7", 10911))
V6 = pack_host(HostAddress("2001:db8::1", 10911))
PROPS = encode_properties({"TAGS": "TagA"})
MAX_BODY = 4 << 20


def _run(*topics: str, born: bytes = V4, body: bytes = b"hello") -> bytes:
    writer = RunWriter(born)
    for index, topic in enumerate(topics):
        writer.add(topic, topic.encode(), index, body, PROPS, 7, 0, 1_000 + index)
    assert writer.count == len(topics)
    return writer.getvalue()


def test_writer_and_scan_mirror_each_other() -> None:
    data = _run("TopicTest", "TopicTest", "Other")
    layout = scan_run(data, MAX_BODY)
    assert layout.count == 3
    assert layout.topics == [b"TopicTest", b"TopicTest", b"Other"]
    assert layout.topics[0] is layout.topics[1]  # one object for consecutive equal topics
    assert layout.queue_ids == [0, 1, 2]
    assert layout.sys_flags == [0, 0, 0]
    assert layout.store_timestamp_positions == [56, 56, 56]
    assert layout.starts == [0, layout.sizes[0], layout.sizes[0] + layout.sizes[1]]
    assert sum(layout.sizes) == len(data)


def test_a_placed_run_record_decodes_like_any_record() -> None:
    """With the store's fields patched in, each record of a run is a commitlog record."""
    data = bytearray(_run("TopicTest"))
    patch_record(data, 0, 56, 41, 5_000, 2_000)
    struct.pack_into(">8s", data, 64, V4)  # the store host, as the store writes it
    record = decode_record(data, 0, len(data), expected_offset=5_000)
    assert (record.topic, record.queue_id, record.body, record.flag) == (
        "TopicTest",
        0,
        b"hello",
        7,
    )
    assert (record.queue_offset, record.store_timestamp_ms, str(record.store_host)) == (
        41,
        2_000,
        "10.0.0.7:10911",
    )
    assert record.properties == {"TAGS": "TagA"}
    assert record.born_timestamp_ms == 1_000


def test_the_writer_leaves_the_store_fields_zero() -> None:
    data = _run("TopicTest")
    queue_offset, physical_offset = struct.unpack_from(">qq", data, 20)
    store_timestamp, store_host = struct.unpack_from(">q8s", data, 56)
    assert (queue_offset, physical_offset, store_timestamp, store_host) == (0, 0, 0, bytes(8))


def test_ipv6_born_host_shifts_the_store_fields() -> None:
    data = _run("TopicTest", "TopicTest", born=V6)
    layout = scan_run(data, MAX_BODY)
    assert layout.sys_flags == [SYSFLAG_BORN_HOST_V6] * 2
    assert layout.store_timestamp_positions == [68, 68]
    assert layout.sizes[0] == 91 + 12 + 5 + 9 + len(PROPS)


def test_long_topic_takes_the_v2_magic() -> None:
    long_topic = "T" * (MAX_TOPIC_BYTES_V1 + 1)
    assert topic_part(long_topic.encode())[0] == MESSAGE_MAGIC_V2
    assert topic_part(b"short")[0] == MESSAGE_MAGIC_V1
    layout = scan_run(_run(long_topic, "short", long_topic), MAX_BODY)
    assert layout.topics == [long_topic.encode(), b"short", long_topic.encode()]


def test_v2_topic_after_a_v1_topic_with_the_same_leading_bytes_is_read_again() -> None:
    """A v1 topic ',' is the bytes 01 2C; a v2 topic of 300 bytes starts 01 2C too."""
    v2_topic = "x" * 300
    layout = scan_run(_run(",", v2_topic), MAX_BODY)
    assert layout.topics == [b",", v2_topic.encode()]


def test_empty_run_has_no_records() -> None:
    assert scan_run(b"", MAX_BODY).count == 0


def test_empty_body_is_a_record() -> None:
    assert scan_run(_run("T", body=b""), MAX_BODY).sizes == [91 + 1 + len(PROPS)]


def _error(data: bytes | bytearray, max_body: int = MAX_BODY, max_records: int = 100) -> str:
    with pytest.raises(RecordError) as info:
        scan_run(data, max_body, max_records)
    return str(info.value)


def test_torn_run_names_the_record_that_does_not_fit() -> None:
    data = _run("T", "T")
    assert _error(data[:-1]).startswith("record 1 of the run (byte ")
    assert "does not fit" in _error(data[:-1])
    assert "not a whole record" in _error(data + b"\x00" * 10)


def test_bad_magic_is_reported() -> None:
    data = bytearray(_run("T"))
    struct.pack_into(">i", data, 4, 0x12345678)
    assert "bad magic 0x12345678" in _error(data)


def test_body_crc_mismatch_is_reported() -> None:
    data = bytearray(_run("T", "T"))
    data[len(data) // 2 + 90] ^= 0xFF  # inside the second record's body (at 88..93)
    message = _error(data)
    assert message.startswith("record 1 of the run")
    assert "body CRC mismatch" in message


def test_the_store_host_bit_is_refused() -> None:
    data = bytearray(_run("T"))
    struct.pack_into(">i", data, 36, SYSFLAG_STORE_HOST_V6)
    assert "store host bit" in _error(data)


def test_body_longer_than_the_limit_is_refused() -> None:
    assert "outside 0..4 (--max-message-body-bytes)" in _error(_run("T"), max_body=4)


def test_lengths_that_do_not_add_up_are_refused() -> None:
    data = bytearray(_run("T"))
    struct.pack_into(">i", data, 0, len(data) + 1)  # total_size says one byte more
    assert "do not add up" in _error(data + b"\x00")
    data = bytearray(_run("T"))
    data[88 + 5 + 2 + 1] += 1  # the properties length (after the body and topic)
    assert "do not add up" in _error(data)


def test_empty_topic_is_refused() -> None:
    writer = RunWriter(V4)  # add() refuses to encode one: add_many() has no such check
    writer.add_many(MESSAGE_MAGIC_V1, b"\x00", [0], [b"body"], [b""], 1)
    assert "empty" in _error(writer.getvalue())


def test_more_records_than_the_limit_are_refused() -> None:
    assert "more than 2 records" in _error(_run("T", "T", "T"), max_records=2)
    assert scan_run(_run("T", "T"), MAX_BODY, 2).count == 2


def test_writer_crc_is_zlib_crc32_of_the_body() -> None:
    data = _run("T", body=b"payload")
    assert struct.unpack_from(">I", data, 8)[0] == zlib.crc32(b"payload")


def test_topic_part_refuses_empty_and_oversize_topics() -> None:
    with pytest.raises(ValueError, match=r"1\.\.32767"):
        topic_part(b"")
    with pytest.raises(ValueError, match=r"1\.\.32767"):
        topic_part(b"x" * 32768)


def test_worked_example_run_record_differs_from_the_stored_one_only_in_store_fields() -> None:
    """docs/formats.md, "Record runs": the commitlog example as a run record."""
    rec = encode_record(
        "TopicTest", b"TopicTest", 3, b"hello", b"TAGS\x01TagA\x02", 7, 0, 1_000, V4, bytes(8),
        2, 99,
    )  # fmt: skip
    run_record = rec.data
    assert scan_run(run_record, MAX_BODY).sizes == [115]
    stored = bytearray(run_record)
    patch_record(stored, 0, 56, 41, 5_000, 2_000)
    struct.pack_into(">8s", stored, 64, V4)
    differing = [i for i in range(115) if run_record[i] != stored[i]]
    assert {i // 8 * 8 for i in differing} <= {16, 24, 32, 56, 64}
    assert bytes(stored[20:36]) == bytes.fromhex("00000000000000290000000000001388")
    assert bytes(stored[56:72]) == bytes.fromhex(
        "00000000000007D00A0000070000 2A9F".replace(" ", "")
    )

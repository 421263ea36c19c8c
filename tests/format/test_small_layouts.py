"""Message ids, hosts, properties, checkpoint, segment names, resync."""

from __future__ import annotations

import pytest

from tide.format import (
    CHECKPOINT_FILE_BYTES,
    Checkpoint,
    HostAddress,
    MessageIdError,
    decode_properties,
    encode_properties,
    encode_record,
    find_next_record,
    make_msg_id,
    msg_id_prefix,
    pack_host,
    parse_host,
    parse_msg_id,
    parse_segment_name,
    patch_record,
    property_error,
    segment_name,
)


def test_msg_id_round_trip_ipv4() -> None:
    host = HostAddress("192.168.0.1", 10911)
    msg_id = make_msg_id(msg_id_prefix(host), 1 << 40)
    assert msg_id == "C0A80001" + "00002A9F" + "0000010000000000"
    assert parse_msg_id(msg_id) == (host, 1 << 40)


def test_msg_id_round_trip_ipv6() -> None:
    host = HostAddress("::1", 8080)
    msg_id = make_msg_id(msg_id_prefix(host), 77)
    assert len(msg_id) == 56
    assert parse_msg_id(msg_id) == (host, 77)


@pytest.mark.parametrize("bad", ["", "XYZ", "0" * 31, "G" * 32])
def test_bad_msg_ids(bad: str) -> None:
    with pytest.raises(MessageIdError):
        parse_msg_id(bad)


@pytest.mark.parametrize(
    ("text", "host"),
    [
        ("127.0.0.1:10911", HostAddress("127.0.0.1", 10911)),
        ("[::1]:5", HostAddress("::1", 5)),
    ],
)
def test_parse_host(text: str, host: HostAddress) -> None:
    assert parse_host(text) == host
    assert str(host) == text


@pytest.mark.parametrize("bad", ["localhost:1", "1.2.3.4", "1.2.3.4:99999", ":80", "[::1]80"])
def test_parse_host_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="host"):
        parse_host(bad)


def test_properties_round_trip_and_rocketmq_shape() -> None:
    props = {"KEYS": "a b", "TAGS": "T", "UNIQ_KEY": "ü"}
    data = encode_properties(props)
    assert data == "KEYS\x01a b\x02TAGS\x01T\x02UNIQ_KEY\x01ü\x02".encode()
    assert decode_properties(data) == props
    assert decode_properties(b"") == {}
    assert decode_properties(b"a\x01b") == {"a": "b"}  # no trailing separator


def test_property_error() -> None:
    assert property_error("a", "b") is None
    assert property_error("a\x01", "b") is not None
    assert property_error("a", "b\x02") is not None
    assert property_error("", "b") is not None


def test_checkpoint_is_4_kib_and_big_endian() -> None:
    cp = Checkpoint(1, 2, 3, 4, 5)
    data = cp.pack()
    assert len(data) == CHECKPOINT_FILE_BYTES
    assert data[:8] == (1).to_bytes(8, "big") and data[32:40] == (5).to_bytes(8, "big")
    assert not any(data[40:])
    assert Checkpoint.unpack(data) == cp
    with pytest.raises(ValueError):
        Checkpoint.unpack(b"short")


def test_segment_names() -> None:
    assert segment_name(1073741824) == "00000000001073741824"
    assert parse_segment_name("00000000001073741824") == 1073741824
    assert parse_segment_name("0000000000107374182") is None
    assert parse_segment_name("00000000001073741824.alloc") is None


def test_resync_finds_the_next_valid_record() -> None:
    host = pack_host(HostAddress("127.0.0.1", 1))
    buf = bytearray(1024)
    pos = 0
    starts = []
    for body in (b"a" * 40, b"b" * 40, b"c" * 40):
        rec = encode_record("T", b"T", 0, body, b"", 0, 0, 1, host, host)
        buf[pos : pos + len(rec.data)] = rec.data
        patch_record(buf, pos, rec.store_timestamp_pos, 0, 4096 + pos, 1)
        starts.append(pos)
        pos += len(rec.data)
    buf[starts[1] + 100] ^= 1  # corrupt the second record's body
    assert find_next_record(buf, starts[1], len(buf), 4096) == starts[2]
    assert find_next_record(buf, starts[2], len(buf), 4096) == -1

"""Pull answers as commitlog records (ENCODING_RECORDS): the client decodes each record into
the message ``from_stored_message`` gives for the storage's ``StoredMessage`` of it, and
refuses bytes that are not exactly the announced records."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.storage.convert import stored_message_fields
from tide.client import MessageQueue, PullStatus, TideError
from tide.client._convert import from_pull_response, from_stored_message
from tide.client._pull_consumer import GatewayReader
from tide.client._records import decode_pull_records, received_message
from tide.client._types import ReceivedMessage
from tide.format import (
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_STORE_HOST_V6,
    SYSFLAG_TRANSACTION_COMMIT,
    HostAddress,
    decode_record,
    encode_properties,
    encode_record,
    pack_host,
    patch_record,
)
from tide.stored import stored_message
from tide.v1 import gateway_pb2, storage_pb2

BROKER = "broker-a"
BORN = HostAddress("192.168.1.20", 53012)
STORE = HostAddress("10.0.0.7", 10911)
BORN_V6 = HostAddress("fe80::1", 4000)
STORE_V6 = HostAddress("2001:db8::7", 10911)


def stored_record(
    topic: str = "TopicTest",
    body: bytes = b"hello",
    properties: dict[str, str] | None = None,
    *,
    born: HostAddress = BORN,
    store: HostAddress = STORE,
    queue_id: int = 1,
    queue_offset: int = 7,
    physical_offset: int = 4096,
    store_timestamp_ms: int = 1_700_000_000_123,
    flag: int = 0,
    sys_flag: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
) -> bytes:
    """A record as the commitlog holds it (lock-time fields patched in)."""
    sys_flag |= SYSFLAG_BORN_HOST_V6 if born.is_v6 else 0
    sys_flag |= SYSFLAG_STORE_HOST_V6 if store.is_v6 else 0
    encoded = encode_record(
        topic,
        topic.encode("utf-8"),
        queue_id,
        body,
        encode_properties(properties or {}),
        flag,
        sys_flag,
        1_700_000_000_000,
        pack_host(born),
        pack_host(store),
        reconsume_times,
        prepared_transaction_offset,
    )
    data = bytearray(encoded.data)
    patch_record(
        data, 0, encoded.store_timestamp_pos, queue_offset, physical_offset, store_timestamp_ms
    )
    return bytes(data)


def reference(data: bytes) -> ReceivedMessage:
    """The message the ENCODING_MESSAGES path gives: the storage's Read (fast fields, else
    the general decoder) then ``from_stored_message``."""
    offset = decode_record(data, 0, len(data)).physical_offset
    fields = stored_message_fields(data, offset, {})
    if fields is None:
        message = stored_message(decode_record(data, 0, len(data)))
    else:
        message = storage_pb2.StoredMessage(**fields)
    return from_stored_message(BROKER, message)


def decode_one(data: bytes) -> ReceivedMessage:
    (message,) = decode_pull_records(BROKER, data, 1)
    return message


CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "empty body": {"body": b""},
    "tags keys uniq": {
        "properties": {"UNIQ_KEY": "AC1100", "TAGS": "TagA", "KEYS": "k1 k2", "p": "v"}
    },
    "user properties only": {"properties": {"a": "b", "é": "ü"}},
    "empty keys and tags": {"properties": {"KEYS": "", "TAGS": ""}},
    "queue 0 offset 0": {"queue_id": 0, "queue_offset": 0, "physical_offset": 0},
    "flags and reconsume": {
        "flag": 5,
        "sys_flag": SYSFLAG_TRANSACTION_COMMIT,
        "reconsume_times": 3,
        "prepared_transaction_offset": 9,
    },
    "big offset": {"physical_offset": 2**40 + 17, "queue_offset": 2**33},
    "high port": {"born": HostAddress("255.255.255.255", 65535)},
    "topic of 127 bytes": {"topic": "t" * 127},
    "topic over 127 bytes": {"topic": "t" * 128, "properties": {"TAGS": "A"}},
    "non-ascii topic": {"topic": "主题"},
    "ipv6 born": {"born": BORN_V6},
    "ipv6 store": {"store": STORE_V6, "properties": {"KEYS": "a"}},
    "ipv6 both": {"born": BORN_V6, "store": STORE_V6},
    "ipv4-mapped ipv6": {"born": HostAddress("::ffff:1.2.3.4", 1)},
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_field_is_what_the_stored_message_gives(case: str) -> None:
    data = stored_record(**CASES[case])
    got = decode_one(data)
    want = reference(data)
    for name in ReceivedMessage.__dataclass_fields__:
        assert getattr(got, name) == getattr(want, name), name
    assert got == want


def test_the_documented_values() -> None:
    props = {"UNIQ_KEY": "U1", "TAGS": "TagA", "KEYS": "k1 k2"}
    data = stored_record(properties=props, physical_offset=0x1234)
    got = decode_one(data)
    assert got.queue == MessageQueue("TopicTest", BROKER, 1)
    assert got.msg_id == "0A00000700002A9F0000000000001234"
    assert (got.born_host, got.store_host) == ("192.168.1.20:53012", "10.0.0.7:10911")
    assert (got.tags, got.keys, got.unique_key) == ("TagA", ("k1", "k2"), "U1")
    assert (got.queue_offset, got.physical_offset, got.size_bytes) == (7, 0x1234, len(data))
    v6 = decode_one(stored_record(born=BORN_V6, store=STORE_V6, physical_offset=1))
    assert (v6.born_host, v6.store_host) == ("[fe80::1]:4000", "[2001:db8::7]:10911")
    assert v6.msg_id == pack_host(STORE_V6).hex().upper() + "0000000000000001"


def test_records_back_to_back_decode_in_order() -> None:
    datas = [stored_record(**{**CASES[case], "queue_offset": i}) for i, case in enumerate(CASES)]
    got = decode_pull_records(BROKER, b"".join(datas), len(datas))
    assert got == tuple(reference(data) for data in datas)
    assert [m.queue_offset for m in got] == list(range(len(datas)))


def _random_text(rng: random.Random, low: int, high: int) -> str:
    alphabet = "abcXYZ019%|_-éü主"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


def _random_host(rng: random.Random) -> HostAddress:
    if rng.random() < 0.2:
        return HostAddress(f"2001:db8::{rng.randint(0, 0xFFFF):x}", rng.randint(0, 65535))
    ip = ".".join(str(rng.randint(0, 255)) for _ in range(4))
    return HostAddress(ip, rng.randint(0, 65535))


def _random_record(rng: random.Random) -> bytes:
    props = {_random_text(rng, 1, 8): _random_text(rng, 0, 8) for _ in range(rng.randint(0, 3))}
    if rng.random() < 0.5:
        props["TAGS"] = _random_text(rng, 0, 5)
    if rng.random() < 0.5:
        props["KEYS"] = " ".join(_random_text(rng, 1, 4) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.5:
        props["UNIQ_KEY"] = _random_text(rng, 1, 32)
    topic = _random_text(rng, 1, 12) if rng.random() < 0.9 else "T" * rng.randint(120, 300)
    return stored_record(
        topic,
        rng.randbytes(rng.choice((0, 1, 10, 300))),
        props,
        born=_random_host(rng),
        store=_random_host(rng),
        queue_id=rng.randint(0, 64),
        queue_offset=rng.randint(0, 2**40),
        physical_offset=rng.randint(0, 2**50),
        store_timestamp_ms=rng.randint(0, 2**42),
        flag=rng.randint(-(2**31), 2**31 - 1),
        sys_flag=rng.choice((0, SYSFLAG_TRANSACTION_COMMIT)),
        reconsume_times=rng.randint(0, 16),
    )


def test_fast_path_matches_decode_record_on_random_records() -> None:
    rng = random.Random(20261122)
    datas = [_random_record(rng) for _ in range(500)]
    got = decode_pull_records(BROKER, b"".join(datas), len(datas))
    general = tuple(received_message(BROKER, decode_record(d, 0, len(d))) for d in datas)
    assert got == general
    assert got == tuple(reference(data) for data in datas)


# -- bytes that are not exactly the announced records -----------------------------------
def test_empty_records_with_count_zero() -> None:
    assert decode_pull_records(BROKER, b"", 0) == ()


def test_count_mismatch_raises() -> None:
    two = stored_record() + stored_record(physical_offset=5000)
    with pytest.raises(TideError, match=r"2 records in \d+ bytes, 3 announced"):
        decode_pull_records(BROKER, two, 3)
    with pytest.raises(TideError, match=r"record 1 .*bytes follow the 1 records announced"):
        decode_pull_records(BROKER, two, 1)
    with pytest.raises(TideError, match="0 records in 0 bytes, 1 announced"):
        decode_pull_records(BROKER, b"", 1)


@pytest.mark.parametrize("store", [STORE, STORE_V6])
def test_truncated_last_record_raises(store: HostAddress) -> None:
    first, last = stored_record(store=store), stored_record(store=store, physical_offset=9000)
    with pytest.raises(TideError, match=r"record 1 \(at byte \d+ .*TOTALSIZE \d+ is outside"):
        decode_pull_records(BROKER, first + last[:-1], 2)
    with pytest.raises(TideError, match=r"record 1 .*3 bytes left, too few"):
        decode_pull_records(BROKER, first + last[:3], 2)


@pytest.mark.parametrize("store", [STORE, STORE_V6])
def test_corrupted_body_raises(store: HostAddress) -> None:
    good = stored_record(store=store)
    bad = bytearray(stored_record(store=store, body=b"hello world", physical_offset=9000))
    bad[bad.index(b"hello world")] ^= 0x01
    with pytest.raises(TideError, match=r"record 1 .*body CRC mismatch"):
        decode_pull_records(BROKER, good + bytes(bad), 2)


@pytest.mark.parametrize("garbage", [b"\x00\x01", b"\x00" * 200, stored_record()[:95]])
def test_trailing_garbage_raises(garbage: bytes) -> None:
    two = stored_record() + stored_record(physical_offset=5000)
    with pytest.raises(TideError, match=r"record 2 .*bytes follow the 2 records announced"):
        decode_pull_records(BROKER, two + garbage, 2)
    with pytest.raises(TideError, match="record 2 "):
        decode_pull_records(BROKER, two + garbage, 3)


@pytest.mark.parametrize(
    ("patch", "error"),
    [
        (lambda d: d.__setitem__(slice(4, 8), b"\x00\x00\x00\x01"), "bad magic 0x00000001"),
        (lambda d: d.__setitem__(slice(4, 8), b"\xcb\xd4\x31\x94"), "no message record .*blank"),
        (lambda d: d.__setitem__(slice(84, 88), b"\x00\x00\x00\x63"), "body length 99"),
        (lambda d: d.__setitem__(slice(84, 88), b"\xff\xff\xff\xff"), "body length -1"),
        (lambda d: d.__setitem__(slice(20, 28), b"\x00" * 8), None),  # queue offset 0: fine
        (lambda d: d.__setitem__(slice(28, 36), b"\xff" * 8), "physical offset -1"),
        (lambda d: d.__setitem__(-8, 8), "field lengths"),  # properties length 7 -> 8
    ],
)
def test_malformed_fields_raise(patch: Any, error: str | None) -> None:
    data = bytearray(stored_record(properties={"TAGS": "A"}))
    patch(data)
    if error is None:
        decode_one(bytes(data))
        return
    with pytest.raises(TideError, match=f"record 0 .*{error}"):
        decode_one(bytes(data))


def test_topic_not_utf8_raises() -> None:
    data = bytearray(stored_record(topic="TopicTest", body=b""))
    data[data.index(b"TopicTest")] = 0xFF
    with pytest.raises(TideError, match=r"record 0 .*topic is not UTF-8"):
        decode_one(bytes(data))


# -- the pull answer and request ----------------------------------------------------------
QUEUE = MessageQueue("TopicTest", BROKER, 1)


def test_pull_response_with_records_decodes_them() -> None:
    datas = [stored_record(queue_offset=7), stored_record(queue_offset=8, physical_offset=5000)]
    response = gateway_pb2.PullResponse(
        status=gateway_pb2.PullResponse.FOUND,
        records=b"".join(datas),
        record_count=2,
        next_offset=9,
    )
    result = from_pull_response(QUEUE, response)
    assert result.status is PullStatus.FOUND
    assert result.messages == tuple(reference(d) for d in datas)
    assert result.next_offset == 9


def test_pull_response_with_messages_is_decoded_as_before() -> None:
    data = stored_record()
    fields = stored_message_fields(data, 4096, {})
    assert fields is not None
    response = gateway_pb2.PullResponse(
        status=gateway_pb2.PullResponse.FOUND, messages=[storage_pb2.StoredMessage(**fields)]
    )
    assert from_pull_response(QUEUE, response).messages == (decode_one(data),)


def test_pull_response_with_a_count_but_no_records_raises() -> None:
    response = gateway_pb2.PullResponse(status=gateway_pb2.PullResponse.FOUND, record_count=1)
    with pytest.raises(TideError, match="0 records in 0 bytes, 1 announced"):
        from_pull_response(QUEUE, response)


def test_pull_requests_ask_for_records() -> None:
    reader = GatewayReader(None)  # type: ignore[arg-type]  # pull_request calls nothing
    request = reader.pull_request("G", QUEUE, 0, 32, "*", 0)
    assert request.encoding == gateway_pb2.PullRequest.ENCODING_RECORDS

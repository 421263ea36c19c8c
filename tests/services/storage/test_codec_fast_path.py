"""The codec's encoding of a batch (checks inline, then tide.format's ``encode_record``)
gives the bytes of its general path, and the same errors; the Append response builder
gives the documented ids; a Read's records decoded by tide.format's reader give the
general decoder's StoredMessage."""

from __future__ import annotations

import random

import pytest

from services.storage import convert
from services.storage.engine.commitlog import AppendBatch
from services.storage.engine.errors import InvalidMessageError
from services.storage.engine.message_codec import MessageCodec, MessageInput
from services.storage.servicer import _append_response
from tide.format import decode_record, make_msg_id, msg_id_prefix, parse_host
from tide.stored import stored_message
from tide.v1 import storage_pb2 as pb

NOW_MS = 1_800_000_000_000
COUNTS = {"T": 8, "t" * 127: 2, "Other%|_-9": 1}


def _messages() -> list[pb.Message]:
    return [
        pb.Message(topic="T", queue_id=3, body=b"x" * 128, born_host="10.0.0.9:5555"),
        pb.Message(topic="T", queue_id=0, body=b"y", properties={"UNIQ_KEY": "K1", "a": "b"}),
        pb.Message(topic="T", queue_id=7, body=b"z", tags="TagA", keys=["k1", "k2"], flag=5),
        pb.Message(topic="T", queue_id=1, body=b"", sys_flag=0b1100, born_timestamp_ms=42),
        pb.Message(
            topic="T", queue_id=1, body=b"w", reconsume_times=3, prepared_transaction_offset=9
        ),
        pb.Message(topic="t" * 127, queue_id=1, body=b"long topic, 1-byte length"),
        pb.Message(topic="Other%|_-9", queue_id=0, body=b"odd characters"),
        pb.Message(topic="T", queue_id=2, body=b"v6 born host", born_host="[::1]:7"),
        pb.Message(topic="T", queue_id=2, body=b"ok again", born_host="10.0.0.9:5555"),
    ]


def _codec(store_host: str = "127.0.0.1:10911") -> MessageCodec:
    codec = MessageCodec(parse_host(store_host), 4 << 20)
    for topic in COUNTS:
        codec.topic_bytes(topic)  # the store checks every topic before encoding
    return codec


@pytest.mark.parametrize("store_host", ["127.0.0.1:10911", "[::1]:10911"])
@pytest.mark.parametrize("default_host", ["", "192.168.1.2:4000", "[fe80::1]:4000"])
def test_inline_encoding_matches_the_general_encoder(store_host: str, default_host: str) -> None:
    messages = _messages()
    codec = _codec(store_host)
    fast = codec.encode_batch(messages, COUNTS, default_host)
    born = codec.born_host(default_host) if default_host else None
    if born is None:
        v6 = bool(codec._store_flag)
        born = (codec._store_host, 16 if v6 else 0)
    general = codec._encode_each(messages, COUNTS, NOW_MS, born)
    # born_timestamp_ms 0 takes the clock: compare with the clock's value patched in
    for got, want, message in zip(fast, general, messages, strict=True):
        if message.born_timestamp_ms:
            assert got == want
        else:
            assert (got.topic, got.queue_id, got.sys_flag, got.store_timestamp_pos) == (
                want.topic,
                want.queue_id,
                want.sys_flag,
                want.store_timestamp_pos,
            )
            assert len(got.data) == len(want.data)
            # only the 8 born-timestamp bytes (after the 40-byte prefix) may differ
            assert got.data[:40] == want.data[:40] and got.data[48:] == want.data[48:]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"queue_id": 8}, "message[1]: queue_id 8 is outside the 8 write queues"),
        ({"queue_id": -1}, "message[1]: queue_id -1 is outside"),
        ({"sys_flag": 1 << 4}, "message[1]: sys_flag 0x10 sets bits reserved"),
        ({"born_host": "nonsense"}, "message[1]: born_host:"),
        ({"properties": {"a": "b\x01c"}}, "message[1]: "),
        ({"keys": ["a b"]}, "message[1]: a key is empty or contains a space"),
        ({"body": b"x" * (4 << 20 | 1)}, "message[1]: body is 4194305 bytes"),
    ],
)
def test_inline_encoding_reports_the_general_errors(bad: dict[str, object], error: str) -> None:
    good = {"topic": "T", "queue_id": 1, "body": b"x"}
    messages = [pb.Message(**good), pb.Message(**{**good, **bad})]  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError) as fast:
        _codec().encode_batch(messages, COUNTS)
    with pytest.raises(InvalidMessageError) as general:
        codec = _codec()
        codec._encode_each(messages, COUNTS, NOW_MS, (codec._store_host, 0))
    assert str(fast.value).startswith(error), str(fast.value)
    assert str(fast.value) == str(general.value)


def test_in_process_inputs_take_the_same_path() -> None:
    codec = _codec()
    record = codec.encode_batch([MessageInput("T", 2, b"body", tags="A")], COUNTS)[0]
    assert (record.topic, record.queue_id) == ("T", 2)


@pytest.mark.parametrize("status", [pb.PUT_OK, pb.FLUSH_DISK_TIMEOUT])
def test_append_response_carries_offset_ids_and_status(status: pb.AppendStatus.ValueType) -> None:
    batch = AppendBatch(NOW_MS, [0, 200, 2**40], [200, 210, 90], [5, 6, 0], 2**40 + 90)
    request = pb.AppendRequest(messages=[pb.Message()] * 3)
    response = _append_response(batch, request, status, "7F00000100002A9F")
    assert [r.msg_id for r in response.results] == [
        make_msg_id("7F00000100002A9F", offset) for offset in (0, 200, 2**40)
    ]
    assert [(r.physical_offset, r.size, r.queue_offset) for r in response.results] == [
        (0, 200, 5),
        (200, 210, 6),
        (2**40, 90, 0),
    ]
    assert {r.status for r in response.results} == {status}
    assert {r.store_timestamp_ms for r in response.results} == {NOW_MS}


# -- Read: the one-step decoder ----------------------------------------------------------
def _stored(record_data: bytes, offset: int) -> bytes:
    """The record as the commitlog holds it: the physical offset patched in."""
    data = bytearray(record_data)
    data[28:36] = offset.to_bytes(8, "big")
    return bytes(data)


@pytest.mark.parametrize("index", range(len(_messages())))
def test_read_fields_match_the_general_decoder(index: int) -> None:
    message = _messages()[index]
    record = _codec().encode_batch([message], COUNTS, "10.1.2.3:4444")[0]
    offset = 1 << 33
    data = _stored(record.data, offset)
    decoded = decode_record(data, 0, len(data), expected_offset=offset)
    expected = stored_message(decoded)
    # The id names the record's own store host, whoever serves the read (a slave too).
    assert expected.msg_id == make_msg_id(msg_id_prefix(decoded.store_host), offset)
    fields = convert.stored_message_fields(data, offset, {})
    if record.sys_flag & 0b110000:  # IPv6 hosts: left to the general decoder
        assert fields is None
        return
    assert fields is not None
    assert pb.StoredMessage(**fields) == expected


def test_read_fields_refuse_what_the_general_decoder_refuses() -> None:
    record = _codec().encode_batch(_messages()[:1], COUNTS)[0]
    data = _stored(record.data, 500)
    assert convert.stored_message_fields(data, 500, {}) is not None
    assert convert.stored_message_fields(data, 501, {}) is None  # wrong offset
    assert convert.stored_message_fields(data[:-1], 500, {}) is None  # short
    corrupt = bytearray(data)
    corrupt[100] ^= 0xFF  # inside the body: CRC mismatch
    assert convert.stored_message_fields(bytes(corrupt), 500, {}) is None
    assert convert.stored_message_fields(bytes(len(data)), 500, {}) is None


@pytest.mark.parametrize("seed", range(10))
def test_a_reads_records_decode_together_as_one_by_one(seed: int) -> None:
    """convert.stored_messages_fields (one reader call for a Read's records) gives what
    the general decoder gives each record, and None when one record is not the reader's
    (an IPv6 born host) or was not read where it says (the caller then goes one by one)."""
    rnd = random.Random(seed)
    messages = [rnd.choice(_messages()) for _ in range(rnd.randint(1, 20))]
    records = _codec().encode_batch(messages, COUNTS, "10.1.2.3:4444")
    offsets, pieces, at = [], [], 1 << 30
    for record in records:
        offsets.append(at)
        pieces.append(_stored(record.data, at))
        at += len(record.data)
    found = convert.stored_messages_fields(b"".join(pieces), offsets, {})
    if any(record.sys_flag & 0b110000 for record in records):
        assert found is None
        return
    assert found is not None
    for fields, data, offset in zip(found, pieces, offsets, strict=True):
        decoded = decode_record(data, 0, len(data), expected_offset=offset)
        assert pb.StoredMessage(**fields) == stored_message(decoded)
    assert convert.stored_messages_fields(b"".join(pieces), [o + 1 for o in offsets], {}) is None

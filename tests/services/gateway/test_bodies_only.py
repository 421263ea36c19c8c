"""bodies_only.py: a produce request of bare messages (a topic and a body) told from its
encoded size; every other field, set on any one message, makes it say no."""

from __future__ import annotations

import random

import grpc
import pytest

from services.gateway.bodies_only import (
    field_bytes,
    messages_bytes,
    only_topic_and_bodies,
    only_topic_bodies_and_keys,
    varint_bytes,
)
from services.gateway.validate import check_produce_messages
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb

MAX_BODY_BYTES = 70_000
TOPIC = "T"


def bare(count: int, body_bytes: int = 10, topic: str = TOPIC) -> list[pb.ProduceMessage]:
    return [pb.ProduceMessage(topic=topic, body=b"b" * body_bytes) for _ in range(count)]


def says(messages: list[pb.ProduceMessage], topic: str = TOPIC) -> bool:
    request_bytes = pb.ProduceRequest(messages=messages).ByteSize()
    return only_topic_and_bodies(messages, topic, request_bytes, MAX_BODY_BYTES)


@pytest.mark.parametrize(
    "value", [1, 127, 128, 16_383, 16_384, 2**21 - 1, 2**21, 2**28, 2**35, 2**63 - 1]
)
def test_varint_bytes_is_the_encoded_size(value: int) -> None:
    encoded = pb.ProduceMessage(born_timestamp_ms=value).SerializeToString()
    assert varint_bytes(value) == len(encoded) - 1  # less the field key
    assert varint_bytes(0) == 1  # (a zero field is not encoded at all)


@pytest.mark.parametrize("length", [1, 127, 128, 16_383, 16_384, 70_000])
def test_field_bytes_is_the_encoded_size(length: int) -> None:
    assert field_bytes(length) == pb.ProduceMessage(body=b"x" * length).ByteSize()


@pytest.mark.parametrize(
    "body_bytes",
    [1, 2, 100, 110, 111, 112, 113, 125, 126, 127, 128, 16_370, 16_384, MAX_BODY_BYTES],
)
def test_bare_messages_across_varint_boundaries(body_bytes: int) -> None:
    assert says(bare(3, body_bytes))


def test_mixed_body_sizes_and_long_topics() -> None:
    topic = "t" * 200  # its length is a two-byte varint
    messages = [pb.ProduceMessage(topic=topic, body=b"x" * n) for n in (1, 127, 128, 5000, 127)]
    assert says(messages, topic)


@pytest.mark.parametrize(
    "extra",
    [
        {"tags": "A"},
        {"keys": ["k"]},
        {"properties": {"a": "b"}},
        {"sharding_key": "s"},
        {"queue": pb.QueueRef()},  # an empty route is still a route
        {"queue": pb.QueueRef(broker_name="b", queue_id=1)},
        {"flag": 1},
        {"flag": -1},
        {"born_timestamp_ms": 1},
        {"unique_key": "U"},
    ],
)
@pytest.mark.parametrize("position", [0, 50, 99])
def test_any_other_field_on_any_message_says_no(extra: dict[str, object], position: int) -> None:
    messages = bare(100)
    messages[position] = pb.ProduceMessage(topic=TOPIC, body=b"b" * 10, **extra)  # type: ignore[arg-type]
    assert not says(messages)


def test_unknown_fields_say_no() -> None:
    message = pb.ProduceMessage(topic=TOPIC, body=b"b")
    message.MergeFromString(message.SerializeToString() + b"\xf8\x01\x01")  # field 31 = 1
    assert not says([*bare(2), message])


def test_bodies_out_of_range_say_no() -> None:
    assert not says([*bare(2), pb.ProduceMessage(topic=TOPIC)])  # an empty body
    assert not says([*bare(2), *bare(1, MAX_BODY_BYTES + 1)])


def test_a_size_that_does_not_add_up_says_no() -> None:
    messages = bare(5)
    size = pb.ProduceRequest(messages=messages).ByteSize()
    assert only_topic_and_bodies(messages, TOPIC, size, MAX_BODY_BYTES)
    assert not only_topic_and_bodies(messages, TOPIC, size + 1, MAX_BODY_BYTES)
    assert not only_topic_and_bodies(messages, TOPIC, size - 1, MAX_BODY_BYTES)


def test_the_check_agrees_with_the_field_by_field_one() -> None:
    """Random requests: check_produce_messages gives the same answer told from the size
    as from reading every field."""
    rng = random.Random(6)
    options = [
        {"tags": "A"},
        {"keys": ["k"]},
        {"flag": 3},
        {"born_timestamp_ms": 9},
        {"unique_key": "U1"},
        {"properties": {"p": "v"}},
        {"queue": pb.QueueRef(broker_name="b", queue_id=0)},
    ]
    for _ in range(300):
        messages = []
        for _ in range(rng.randint(1, 40)):
            extra = rng.choice(options) if rng.random() < 0.03 else {}
            body = b"x" * rng.choice([1, 50, 127, 128, 129, 300, 20_000])
            messages.append(pb.ProduceMessage(topic=TOPIC, body=body, **extra))  # type: ignore[arg-type]
        request_bytes = pb.ProduceRequest(messages=messages).ByteSize()
        by_fields = check_produce_messages(messages, MAX_BODY_BYTES)
        by_size = check_produce_messages(messages, MAX_BODY_BYTES, request_bytes)
        assert by_size == by_fields


def test_the_compact_flag_is_not_counted_as_a_message_field() -> None:
    messages = bare(4)
    plain = pb.ProduceRequest(messages=messages)
    compact = pb.ProduceRequest(messages=messages, compact_results=True)
    assert compact.ByteSize() == plain.ByteSize() + 2
    compact_bytes = messages_bytes(compact, compact.ByteSize())
    assert compact_bytes == messages_bytes(plain, plain.ByteSize()) == plain.ByteSize()
    assert only_topic_and_bodies(messages, TOPIC, compact_bytes, MAX_BODY_BYTES)


def keyed(keys: list[str], body_bytes: int = 10) -> list[pb.ProduceMessage]:
    return [
        pb.ProduceMessage(topic=TOPIC, body=b"b" * body_bytes, sharding_key=key) for key in keys
    ]


def keyed_says(messages: list[pb.ProduceMessage]) -> bool:
    request_bytes = pb.ProduceRequest(messages=messages).ByteSize()
    return only_topic_bodies_and_keys(messages, TOPIC, request_bytes, MAX_BODY_BYTES)


@pytest.mark.parametrize("key_chars", [1, 5, 127, 128, 1024])
@pytest.mark.parametrize("body_bytes", [1, 100, 127, 128, 16_384])
def test_keyed_messages_are_told_from_their_size(key_chars: int, body_bytes: int) -> None:
    assert keyed_says(keyed(["k" * key_chars, "é" * key_chars, "g"], body_bytes))


@pytest.mark.parametrize(
    "change",
    [
        {"tags": "A"},
        {"keys": ["k"]},
        {"flag": 1},
        {"born_timestamp_ms": 5},
        {"unique_key": "U" * 32},
        {"delay_level": 1},
        {"body": b""},
    ],
)
def test_keyed_messages_with_anything_else_are_not(change: dict[str, object]) -> None:
    messages = keyed(["g1", "g2", "g3"])
    for name, value in change.items():
        if name == "keys":
            messages[1].keys.extend(["k"])
        else:
            setattr(messages[1], name, value)
    assert not keyed_says(messages)
    messages = keyed(["g1"])
    messages[0].properties["p"] = "v"
    assert not keyed_says(messages)


def test_the_keyed_check_agrees_with_the_field_by_field_one() -> None:
    """Random requests of keyed messages (some with more, some without a key): the
    answer told from the size is the field-by-field one, ``keyed_bodies`` exactly when
    every message is a topic, a body and a key."""
    rng = random.Random(7)
    options: list[dict[str, object]] = [
        {"tags": "A"},
        {"flag": 1},  # 2 bytes, as a missing key's field
        {"born_timestamp_ms": 9},
        {"unique_key": "U1"},
        {"no_key": True},
    ]
    for _ in range(300):
        messages, exact = [], True
        for _ in range(rng.randint(1, 4)):
            extra = dict(rng.choice(options)) if rng.random() < 0.2 else {}
            exact = exact and not extra
            key = rng.choice(["", "g", "group-17", "é" * 70])
            if extra.pop("no_key", False):
                message = pb.ProduceMessage(topic=TOPIC, body=b"x" * rng.choice([1, 127, 300]))
            else:
                message = pb.ProduceMessage(topic=TOPIC, body=b"x" * 5, sharding_key=key)
            for name, value in extra.items():
                setattr(message, name, value)
            messages.append(message)
        request_bytes = pb.ProduceRequest(messages=messages).ByteSize()
        by_fields = check_produce_messages(messages, MAX_BODY_BYTES)
        by_size = check_produce_messages(messages, MAX_BODY_BYTES, request_bytes)
        assert by_size.keyed_bodies is exact
        assert by_size._replace(keyed_bodies=False) == by_fields


@pytest.mark.parametrize(
    ("key", "text"),
    [("a\x01b", "messages[1].sharding_key"), ("k" * 1025, "messages[1].sharding_key")],
)
def test_a_bad_key_of_a_keyed_request_is_named(key: str, text: str) -> None:
    messages = keyed(["g", key, "h"])
    request_bytes = pb.ProduceRequest(messages=messages).ByteSize()
    with pytest.raises(ServiceError) as raised:
        check_produce_messages(messages, MAX_BODY_BYTES, request_bytes)
    assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert text in raised.value.message

"""A produce request of bodies only, read from its bytes (``tide.format._bodies_run``):
the compiled ``scan_bodies`` / ``encode_bodies_run`` against their Python references
(the same answer for random, damaged and edge-case requests, every bound at its
boundary), and both against what the gateway's field-by-field path decides and encodes
(validate.py's check, ``RunWriter.add_many``). The references run on either path; the
compiled comparisons are skipped when the extension is not built or is off."""

from __future__ import annotations

import random

import pytest

from tide.format import (
    UNIQ_KEY,
    HostAddress,
    RunWriter,
    _core,
    pack_host,
    scan_run,
    topic_part,
)
from tide.format._bodies_run import (
    encode_bodies_run_python,
    numbered_keys_python,
    scan_bodies_python,
)
from tide.v1 import gateway_pb2 as pb

compiled = _core.ccore
needs_compiled = pytest.mark.skipif(compiled is None, reason="the compiled core is off")
V4 = pack_host(HostAddress("10.0.0.7", 10911))
V6 = pack_host(HostAddress("::1", 10911))
MAX_BODY = 4096


def request(*messages: pb.ProduceMessage, compact: bool = False, pack: bool = False) -> bytes:
    return pb.ProduceRequest(
        messages=list(messages), compact_results=compact, pack_answers=pack
    ).SerializeToString()


def bare(topic: str = "T", body: bytes = b"x") -> pb.ProduceMessage:
    return pb.ProduceMessage(topic=topic, body=body)


def scans(wire: bytes, max_body: int = MAX_BODY) -> tuple[bytes, int] | None:
    """The reference's answer, held equal to the compiled one's when it runs."""
    expected = scan_bodies_python(wire, max_body)
    if compiled is not None:
        assert compiled.scan_bodies(wire, max_body) == expected
    return expected


def encodes(wire: bytes, keys: list[str], born_host: bytes = V4, queue_id: int = 3) -> bytes:
    """The reference's run, held byte-identical to the compiled one's when it runs."""
    found = scan_bodies_python(wire, MAX_BODY)
    assert found is not None
    magic, part = topic_part(found[0])
    python = RunWriter(born_host)
    encode_bodies_run_python(python, wire, magic, part, queue_id, keys, UNIQ_KEY, 1234)
    if compiled is not None and len(born_host) == 8:
        run = compiled.encode_bodies_run(
            wire, magic, part, queue_id, keys, UNIQ_KEY.encode(), 1234, born_host
        )
        assert run == python.getvalue()
    return python.getvalue()


def test_bodies_only_requests_are_taken() -> None:
    assert scans(request(bare("Topic", b"a"), bare("Topic", b"bc"))) == (b"Topic", 2)
    assert scans(request(bare(), compact=True)) == (b"T", 1)
    assert scans(request(*[bare("Ü" * 60, b"y" * MAX_BODY)] * 3)) == ("Ü".encode() * 60, 3)


def test_pack_answers_is_taken_as_compact_results_is() -> None:
    """A ProduceStream's requests ask for packed answers (field 3, before or after the
    messages): the flag changes only the answer, so the request is still bodies only and
    its run the same as without it."""
    plain = request(bare("T", b"a"), bare("T", b"bc"), compact=True)
    packed = request(bare("T", b"a"), bare("T", b"bc"), compact=True, pack=True)
    assert packed != plain
    assert scans(packed) == scans(b"\x18\x01" + plain) == (b"T", 2)
    keys = ["0A", "0B"]
    assert encodes(packed, keys) == encodes(b"\x18\x01" + plain, keys) == encodes(plain, keys)
    assert scans(plain + b"\x18") is None  # the flag's value cut off


@pytest.mark.parametrize(
    "message",
    [
        pb.ProduceMessage(topic="T", body=b"x", tags="a"),
        pb.ProduceMessage(topic="T", body=b"x", keys=["k"]),
        pb.ProduceMessage(topic="T", body=b"x", properties={"a": "b"}),
        pb.ProduceMessage(topic="T", body=b"x", sharding_key="g"),
        pb.ProduceMessage(topic="T", body=b"x", queue=pb.QueueRef(broker_name="b")),
        pb.ProduceMessage(topic="T", body=b"x", flag=1),
        pb.ProduceMessage(topic="T", body=b"x", born_timestamp_ms=5),
        pb.ProduceMessage(topic="T", body=b"x", unique_key="U"),
        pb.ProduceMessage(topic="T", body=b"x", delay_level=1),
        pb.ProduceMessage(topic="T", body=b"x", deliver_at_ms=1),
        pb.ProduceMessage(topic="T", body=b"x", delay_ms=1),
        pb.ProduceMessage(topic="T", body=b"x", transactional=True),
        pb.ProduceMessage(topic="T", body=b"x", producer_group="g"),
        pb.ProduceMessage(topic="T", body=b"x", transaction_id="t"),
        pb.ProduceMessage(topic="T"),  # no body
        pb.ProduceMessage(body=b"x"),  # no topic
        pb.ProduceMessage(topic="Other", body=b"x"),  # a second topic
        pb.ProduceMessage(topic="T", body=b"y" * (MAX_BODY + 1)),  # one byte over
    ],
)
def test_any_other_field_or_bound_is_left_to_the_field_check(message: pb.ProduceMessage) -> None:
    assert scans(request(bare(), message, bare())) is None


def test_request_fields_other_than_compact_results_are_left() -> None:
    assert scans(b"") is None  # no message
    for extra in (
        pb.ProduceRequest(producer_id="p"),
        pb.ProduceRequest(first_sequence=1),
        pb.ProduceRequest(producer_epoch=1),
    ):
        assert scans(request(bare()) + extra.SerializeToString()) is None


def test_body_at_its_bound_and_one_over() -> None:
    wire = request(bare(body=b"z" * 100))
    assert scans(wire, 100) == (b"T", 1)
    assert scans(wire, 99) is None


def test_a_field_twice_or_out_of_order() -> None:
    message = b"\x0a\x01T\x12\x01x"
    assert scans(b"\x0a" + bytes([len(message)]) + message) == (b"T", 1)
    swapped = b"\x12\x01x\x0a\x01T"  # body first: still a topic and a body
    assert scans(b"\x0a" + bytes([len(swapped)]) + swapped) == (b"T", 1)
    twice = message + b"\x12\x01y"  # protobuf keeps the last; the field check decides
    assert scans(b"\x0a" + bytes([len(twice)]) + twice) is None
    empty_topic = b"\x0a\x00\x12\x01x"
    assert scans(b"\x0a" + bytes([len(empty_topic)]) + empty_topic) is None


@pytest.mark.parametrize("seed", range(60))
def test_damaged_requests_answer_alike(seed: int) -> None:
    rnd = random.Random(seed)
    wire = bytearray(request(*[bare("TopicA", rnd.randbytes(rnd.randint(1, 300)))] * 5))
    for _ in range(rnd.randint(1, 4)):
        at = rnd.randrange(len(wire))
        action = rnd.choice(["flip", "cut", "insert", "varint"])
        if action == "flip":
            wire[at] ^= 1 << rnd.randrange(8)
        elif action == "cut":
            del wire[at:]
        elif action == "insert":
            wire[at:at] = rnd.randbytes(rnd.randint(1, 3))
        else:  # an overlong or unterminated length
            wire[at:at] = b"\xff" * rnd.randint(1, 11)
        if not wire:
            break
    scans(bytes(wire))  # held equal (or both None)


@pytest.mark.parametrize("seed", range(40))
def test_random_batches_scan_and_encode_as_the_field_path(seed: int) -> None:
    rnd = random.Random(seed)
    topic = rnd.choice(["T", "TopicTest", "Ü" * 70])
    bodies = [
        rnd.randbytes(rnd.choice([1, 2, 127, 128, 300, MAX_BODY]))
        for _ in range(rnd.randint(1, 120))
    ]
    wire = request(
        *[bare(topic, body) for body in bodies],
        compact=rnd.random() < 0.5,
        pack=rnd.random() < 0.5,
    )
    assert scans(wire) == (topic.encode(), len(bodies))
    keys = [f"{rnd.getrandbits(128):032X}" for _ in bodies]
    run = encodes(wire, keys)
    # What the plain batch's column encoding gives for the same messages.
    magic, part = topic_part(topic.encode())
    columns = RunWriter(V4)
    properties = [f"{UNIQ_KEY}\x01{key}\x02".encode() for key in keys]
    columns.add_many_python(magic, part, [3] * len(bodies), bodies, properties, 1234)
    assert run == columns.getvalue()
    assert scan_run(run, MAX_BODY).count == len(bodies)


def test_an_ipv6_born_host_takes_the_reference() -> None:
    wire = request(bare(), bare(body=b"yy"))
    run = encodes(wire, ["A", "B"], born_host=V6)
    assert scan_run(run, MAX_BODY).count == 2


@needs_compiled
def test_compiled_encode_refuses_what_it_cannot_take() -> None:
    assert compiled is not None
    wire = request(bare(), bare())
    magic, part = topic_part(b"T")
    args = (magic, part, 0)
    for keys in (["A"], ["A", "B", "C"]):
        with pytest.raises(ValueError, match="one unique key per message"):
            compiled.encode_bodies_run(wire, *args, keys, b"UNIQ_KEY", 1, V4)
    with pytest.raises(ValueError, match="one unique key per message"):
        compiled.encode_bodies_run(
            request(bare(), pb.ProduceMessage(topic="T", body=b"x", tags="t")),
            *args,
            ["A", "B"],
            b"U",
            1,
            V4,
        )
    with pytest.raises(TypeError, match="not a str"):
        compiled.encode_bodies_run(wire, *args, ["A", 5], b"UNIQ_KEY", 1, V4)
    with pytest.raises(ValueError, match="too long"):
        compiled.encode_bodies_run(wire, *args, ["A", "k" * 70_000], b"UNIQ_KEY", 1, V4)
    with pytest.raises(ValueError, match="8 bytes"):
        compiled.encode_bodies_run(wire, *args, ["A", "B"], b"UNIQ_KEY", 1, V6)


def test_reference_encode_refuses_what_it_cannot_take() -> None:
    magic, part = topic_part(b"T")
    with pytest.raises(ValueError, match="2 messages, 1 unique keys"):
        encode_bodies_run_python(
            RunWriter(V4), request(bare(), bare()), magic, part, 0, ["A"], UNIQ_KEY, 1
        )
    with pytest.raises(ValueError, match="not a request of bodies only"):
        encode_bodies_run_python(
            RunWriter(V4),
            request(pb.ProduceMessage(topic="T", body=b"x", tags="t")),
            magic,
            part,
            0,
            ["A"],
            UNIQ_KEY,
            1,
        )


@pytest.mark.parametrize(
    ("head", "first", "count"),
    [("", 0, 0), ("A" * 28, 0, 3), ("7F000001", 0xFFFE, 5), ("H", 65535, 70_000), ("H", -2, 4)],
)
def test_numbered_keys_as_the_reference(head: str, first: int, count: int) -> None:
    expected = numbered_keys_python(head, first, count)
    assert len(expected) == count
    if count >= 2:
        assert expected[1] == f"{head}{(first + 1) & 0xFFFF:04X}"
    if compiled is not None:
        assert compiled.numbered_keys(head, first, count) == expected


@needs_compiled
def test_compiled_numbered_keys_take_an_ascii_head() -> None:
    assert compiled is not None
    with pytest.raises(ValueError, match="ASCII"):
        compiled.numbered_keys("Ü", 0, 1)
    with pytest.raises(ValueError, match="count"):
        compiled.numbered_keys("A", 0, -1)

"""The idempotent produce path's bare batch (produce_idempotent.bare_idempotent): told
from sizes that every message is a topic, a body and the batch's queue, whatever the
request's own fields; anything more (or another queue) is not bare."""

from __future__ import annotations

import pytest

from services.gateway.produce_idempotent import bare_idempotent, derived_unique_keys
from tide.v1 import gateway_pb2 as pb

MAX_BODY = 4 << 20
REF = pb.QueueRef(broker_name="broker-a", queue_id=3)


def request(*messages: pb.ProduceMessage, **fields: object) -> pb.ProduceRequest:
    return pb.ProduceRequest(messages=list(messages), **fields)  # type: ignore[arg-type]


def bare(topic: str = "T", body: bytes = b"x", queue: pb.QueueRef = REF) -> pb.ProduceMessage:
    return pb.ProduceMessage(topic=topic, body=body, queue=queue)


@pytest.mark.parametrize(
    "fields",
    [
        {"producer_id": "p"},
        {"producer_id": "p" * 64, "compact_results": True},
        {"producer_id": "p", "first_sequence": 1 << 40, "producer_epoch": 300},
        {"producer_id": "p", "first_sequence": 127, "producer_epoch": 128},
    ],
)
def test_bare_batches_whatever_the_request_fields(fields: dict[str, object]) -> None:
    req = request(bare(), bare(body=b"y" * 200), bare(body=b"z" * 20_000), **fields)
    assert bare_idempotent(req, req.ByteSize(), MAX_BODY)
    zero = request(bare(queue=pb.QueueRef(broker_name="b")), **fields)  # queue id 0
    assert bare_idempotent(zero, zero.ByteSize(), MAX_BODY)


@pytest.mark.parametrize(
    "other",
    [
        pb.ProduceMessage(topic="T", body=b"x", queue=REF, tags="a"),
        pb.ProduceMessage(topic="T", body=b"x", queue=REF, unique_key="K"),
        pb.ProduceMessage(topic="T", body=b"x", queue=REF, flag=1),
        pb.ProduceMessage(topic="T", body=b"x", queue=REF, delay_ms=5),
        pb.ProduceMessage(topic="T", body=b"x", queue=pb.QueueRef(broker_name="broker-a")),
        pb.ProduceMessage(topic="T", body=b"x", sharding_key="k"),
        pb.ProduceMessage(topic="T", body=b""),
        pb.ProduceMessage(topic="U", body=b"x", queue=REF),  # as long as "T": sizes agree
    ],
)
def test_anything_more_is_not_bare(other: pb.ProduceMessage) -> None:
    req = request(bare(), other, producer_id="p", compact_results=True)
    assert not bare_idempotent(req, req.ByteSize(), MAX_BODY)


def test_a_body_over_the_maximum_is_not_bare() -> None:
    req = request(bare(body=b"x" * 11), producer_id="p")
    assert not bare_idempotent(req, req.ByteSize(), 10)


def test_derived_unique_keys_are_stable_and_per_sequence() -> None:
    req = request(bare(), bare(), bare(), producer_id="p", first_sequence=7)
    keys = derived_unique_keys(req)
    assert keys == derived_unique_keys(req)
    assert keys == derived_unique_keys(req, bare=True)  # read none: the same keys
    assert len(set(keys)) == 3 and all(len(k) == 32 for k in keys)
    assert keys[0][16:] == f"{7:016X}"
    other = request(bare(), producer_id="q", first_sequence=7)
    assert derived_unique_keys(other)[0] != keys[0]

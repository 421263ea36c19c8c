"""The plain produce path encodes what the general path encodes."""

from __future__ import annotations

from typing import Any, cast

import pytest

from services.gateway.produce_plain import PlainBatch, PlainGroup
from services.gateway.records import message_properties
from tide.format import RunWriter, scan_run, topic_part
from tide.v1 import gateway_pb2 as pb

BORN = bytes([10, 0, 0, 1, 0, 0, 0x13, 0x88])
NOW_MS = 1_700_000_000_000


def _one_by_one(messages: list[pb.ProduceMessage], keys: list[str], queue_id: int) -> bytes:
    writer = RunWriter(BORN)
    for message, key in zip(messages, keys, strict=True):
        writer.add(
            "T", b"T", queue_id, message.body, message_properties(message, key),
            message.flag, 0, message.born_timestamp_ms or NOW_MS,
        )  # fmt: skip
    return writer.getvalue()


@pytest.mark.parametrize("queue_id", [0, 2])
@pytest.mark.parametrize("bodies_only", [True, False])
def test_both_encodings_give_the_same_run(queue_id: int, bodies_only: bool) -> None:
    messages = [pb.ProduceMessage(topic="T", body=bytes([i]) * (i + 1)) for i in range(5)]
    if not bodies_only:
        messages[1] = pb.ProduceMessage(topic="T", body=b"x", tags="A", flag=4)
        messages[3] = pb.ProduceMessage(topic="T", body=b"y", born_timestamp_ms=7)
    keys = [f"{i:032X}" for i in range(5)]
    plain = PlainBatch(messages, keys, cast(Any, None), bodies_only=bodies_only)
    group = PlainGroup(cast(Any, None), RunWriter(BORN), queue_id)
    magic, part = topic_part(b"T")
    plain.encode(group, magic, part, NOW_MS)
    run = group.writer.getvalue()
    assert run == _one_by_one(messages, keys, queue_id)
    assert scan_run(run, 1 << 20).count == len(messages)

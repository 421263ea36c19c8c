"""The plain produce path encodes what the general path encodes; a batch takes it with
sharding keys only when they all hash to one queue."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from services.gateway.produce_plain import PlainBatch, PlainGroup
from services.gateway.records import add_message, append_request, message_properties
from services.gateway.routes import QueueRef
from services.gateway.selection import hash_index, sharding_parts
from tide.format import (
    HostAddress,
    RunWriter,
    TopicMessageType,
    pack_host,
    scan_run,
    topic_part,
)
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

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


@pytest.mark.parametrize("born", [BORN, pack_host(HostAddress("::1", 5000))])
def test_a_batch_read_from_its_bytes_encodes_the_same_run(born: bytes) -> None:
    """The bodies-only batch encoded from the request's bytes (tide.format.
    encode_bodies_run, compiled when it runs) gives the column encoding's run."""
    messages = [pb.ProduceMessage(topic="T", body=bytes([i]) * (i + 1)) for i in range(7)]
    keys = [f"{i:032X}" for i in range(7)]
    magic, part = topic_part(b"T")
    runs = []
    for wire in (None, pb.ProduceRequest(messages=messages).SerializeToString()):
        plain = PlainBatch(messages, keys, _view(TopicMessageType.NORMAL), bodies_only=True)
        plain.wire = wire
        group = PlainGroup(cast(Any, None), RunWriter(born), 2)
        plain.encode(group, magic, part, NOW_MS)
        assert group.writer.count == 7
        runs.append(group.writer.getvalue())
    assert runs[0] == runs[1]


def _view(message_type: TopicMessageType) -> Any:
    return SimpleNamespace(message_type=message_type)


@pytest.mark.parametrize("bodies_only", [True, False])
@pytest.mark.parametrize("message_type", [TopicMessageType.FIFO, TopicMessageType.NORMAL])
def test_a_sharded_batch_encodes_what_the_general_path_encodes(
    message_type: TopicMessageType, bodies_only: bool
) -> None:
    """A FIFO topic's records carry their group (``__SHARDINGKEY``), a normal topic's
    do not (the key only routed them), as produce.py's general path writes them, in the
    column loop (messages of a topic, a body and a key only) or one by one."""
    messages = [
        pb.ProduceMessage(topic="T", body=b"m" * n, sharding_key=key)
        for n, key in ((1, "g1"), (2, "g1"), (3, "g2"))
    ]
    if not bodies_only:
        messages[1].tags = "A"
    keys = [f"{i:032X}" for i in range(3)]
    queue = QueueRef("broker-a", 1)
    view = _view(message_type)
    plain = PlainBatch(messages, keys, view, bodies_only=bodies_only, queue=queue)
    group = PlainGroup(cast(Any, None), RunWriter(BORN), queue.queue_id)
    magic, part = topic_part(b"T")
    plain.encode(group, magic, part, NOW_MS)
    expected = RunWriter(BORN)
    fifo = message_type is TopicMessageType.FIFO
    for message, key in zip(messages, keys, strict=True):
        add_message(expected, message, 1, key, NOW_MS, message.sharding_key if fifo else "")
    assert group.writer.getvalue() == expected.getvalue()
    assert plain.groups is fifo


def test_sharding_parts_split_a_keyed_batch_by_queue() -> None:
    """One part when every key hashes to one queue (the one-queue path), several when
    they hash to several (each queue's positions in order), None when a message has no
    key or names its queue, or an empty key would be sent round robin alone."""
    queues = [QueueRef("broker-a", 0), QueueRef("broker-a", 1), QueueRef("broker-b", 0)]
    keys = [f"k{i}" for i in range(30)]
    by_queue: dict[int, list[str]] = {}
    for key in keys:
        by_queue.setdefault(hash_index(key, 3), []).append(key)
    index, sharing = next((i, found) for i, found in by_queue.items() if len(found) >= 2)
    other = next(key for key in keys if hash_index(key, 3) != index)

    def batch(*routes: str | None) -> list[pb.ProduceMessage]:
        return [
            pb.ProduceMessage(topic="T", body=b"x")
            if key is None
            else pb.ProduceMessage(topic="T", body=b"x", sharding_key=key)
            for key in routes
        ]

    one = queues[index]
    assert sharding_parts(batch(sharing[0], sharing[0]), queues) == [(one, [0, 1])]
    assert sharding_parts(batch(*sharing), queues) == [(one, list(range(len(sharing))))]
    two = queues[hash_index(other, 3)]
    spread = batch(sharing[0], other, sharing[1], other)
    assert sharding_parts(spread, queues) == [(one, [0, 2]), (two, [1, 3])]
    assert sharding_parts(spread, queues, keyed=True) == [(one, [0, 2]), (two, [1, 3])]
    assert sharding_parts(batch(sharing[0], None), queues) is None  # one unkeyed
    explicit = pb.ProduceMessage(topic="T", body=b"x", queue=pb.QueueRef(queue_id=0))
    assert sharding_parts([explicit], queues) is None
    assert sharding_parts(batch(sharing[0]), []) is None
    empty = next(key for key in keys if hash_index(key, 3) != 0)  # "" hashes to queue 0
    assert sharding_parts(batch("", "", ""), queues) == [(queues[0], [0, 1, 2])]
    assert sharding_parts(batch(empty, ""), queues) is None


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 2_097_152])
def test_an_append_request_framed_by_hand_is_protobuf_s(size: int) -> None:
    run = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert append_request(run) == storage_pb.AppendRequest(records=[run]).SerializeToString()

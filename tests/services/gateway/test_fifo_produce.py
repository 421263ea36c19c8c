"""FIFO topics through a real cluster: a message without a message group is refused,
a group is stored as RocketMQ 5's ``__SHARDINGKEY`` and keeps all of its messages on
one queue (in send order), and a NORMAL topic still takes a sharding key as a route
only (nothing stored)."""

from __future__ import annotations

import grpc

from services.gateway.selection import hash_index
from tests._cluster import Cluster
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.format import SHARDING_KEY
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

GROUPS = [f"order-{i}" for i in range(12)]
PER_GROUP = 5


def _create(cluster: Cluster, topic: str, message_type: str) -> None:
    cluster.gateway.stub.CreateTopic(
        pb.CreateTopicRequest(
            topic=topic,
            message_type=message_type,
            read_queue_nums=3,
            write_queue_nums=3,
            broker_names=["broker-a", "broker-b"],
        ),
        timeout=RPC_TIMEOUT_S,
    )


def _produce(cluster: Cluster, messages: list[pb.ProduceMessage]) -> pb.ProduceResponse:
    answer: pb.ProduceResponse = cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=messages), timeout=RPC_TIMEOUT_S
    )
    return answer


def _pull_all(cluster: Cluster, topic: str) -> list[tuple[str, storage_pb.StoredMessage]]:
    """Every stored message with its broker, queue by queue, each in queue order."""
    found: list[tuple[str, storage_pb.StoredMessage]] = []
    for broker in ("broker-a", "broker-b"):
        for queue_id in range(3):
            answer = cluster.gateway.stub.Pull(
                pb.PullRequest(
                    consumer_group="fifo-check",
                    topic=topic,
                    broker_name=broker,
                    queue_id=queue_id,
                    max_messages=1_000,
                ),
                timeout=RPC_TIMEOUT_S,
            )
            found.extend((broker, message) for message in answer.messages)
    return found


def test_a_fifo_topic_refuses_a_message_without_a_group(cluster: Cluster, topic_name: str) -> None:
    _create(cluster, topic_name, "FIFO")
    grouped = pb.ProduceMessage(topic=topic_name, body=b"g", sharding_key="order-1")
    bare = pb.ProduceMessage(topic=topic_name, body=b"bare")
    for messages in (
        [bare],
        [grouped, bare],
        [pb.ProduceMessage(topic=topic_name, body=b"t", tags="T")],
    ):
        index = len(messages) - 1
        expect_error(
            grpc.StatusCode.INVALID_ARGUMENT,
            lambda m=messages: _produce(cluster, m),  # type: ignore[misc]
            f"messages[{index}]: topic {topic_name!r} is FIFO",
            "this message has no message group",
            "sharding_key",
        )
    # A group with a property separator cannot be stored as a property.
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: _produce(
            cluster, [pb.ProduceMessage(topic=topic_name, body=b"x", sharding_key="a\x01b")]
        ),
        "messages[0].sharding_key",
    )


def test_a_group_is_stored_and_keeps_one_queue_in_send_order(
    cluster: Cluster, topic_name: str
) -> None:
    _create(cluster, topic_name, "FIFO")
    for round_ in range(PER_GROUP):  # interleaved groups, one request per round
        messages = [
            pb.ProduceMessage(
                topic=topic_name, body=f"{group}/{round_}".encode(), sharding_key=group
            )
            for group in GROUPS
        ]
        results = _produce(cluster, messages).results
        assert all(r.status == pb.ProduceResult.SEND_OK for r in results)
    wait_until(  # the consume queues are built asynchronously (dispatch)
        lambda: len(_pull_all(cluster, topic_name)) == len(GROUPS) * PER_GROUP,
        "every message pullable",
    )
    stored = _pull_all(cluster, topic_name)
    queues: dict[str, set[tuple[str, int]]] = {}
    seen: dict[str, list[int]] = {}
    for broker, message in stored:
        key, stored_round = message.body.decode().split("/")
        assert message.properties[SHARDING_KEY] == key
        queues.setdefault(key, set()).add((broker, message.queue_id))
        seen.setdefault(key, []).append(int(stored_round))
    assert all(len(found) == 1 for found in queues.values()), queues
    assert all(rounds == list(range(PER_GROUP)) for rounds in seen.values()), seen
    # More than one queue is used (12 groups over 6 queues).
    assert len({queue for found in queues.values() for queue in found}) > 1


def test_a_normal_topic_takes_a_sharding_key_as_a_route_only(
    cluster: Cluster, topic_name: str
) -> None:
    _create(cluster, topic_name, "NORMAL")
    routed = pb.ProduceMessage(topic=topic_name, body=b"n", sharding_key="order-1")
    assert _produce(cluster, [routed]).results[0].status == pb.ProduceResult.SEND_OK
    wait_until(lambda: _pull_all(cluster, topic_name), "the message pullable")
    ((_, stored),) = _pull_all(cluster, topic_name)
    assert SHARDING_KEY not in stored.properties


def test_a_batch_of_groups_sharing_a_queue_is_stored_there_in_send_order(
    cluster: Cluster, topic_name: str
) -> None:
    """Such a batch takes the plain path (one queue, one run: produce_plain.py), with each
    record's group stored as the general path stores it."""
    _create(cluster, topic_name, "FIFO")
    queues = 6  # 3 on each of the two brokers
    groups = [key for key in (f"order-{i}" for i in range(200)) if hash_index(key, queues) == 4]
    groups = groups[:4]
    messages = [
        pb.ProduceMessage(topic=topic_name, body=f"{group}/{n}".encode(), sharding_key=group)
        for n in range(PER_GROUP)
        for group in groups
    ]
    results = _produce(cluster, messages).results
    assert {(r.status, r.broker_name, r.queue_id) for r in results} == {
        (pb.ProduceResult.SEND_OK, "broker-b", 1)  # queue 4 of (a 0..2, b 0..2)
    }
    offsets = [r.queue_offset for r in results]
    assert offsets == list(range(offsets[0], offsets[0] + len(messages)))  # one run, in order
    wait_until(
        lambda: len(_pull_all(cluster, topic_name)) == len(messages), "every message pullable"
    )
    stored = _pull_all(cluster, topic_name)
    assert [message.body for _, message in stored] == [m.body for m in messages]
    assert [message.properties[SHARDING_KEY] for _, message in stored] == [
        m.sharding_key for m in messages
    ]

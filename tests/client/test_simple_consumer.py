"""``tide.client.SimpleConsumer`` (POP consumption, docs/client.md) against a real cluster
of two brokers: receive + ack of every message across both brokers, a redelivery after
change_invisible_duration, errors as TideErrors, forward_to_dead_letter, lag."""

from __future__ import annotations

import pytest

from tests._cluster import Cluster
from tide.client import (
    FailedPrecondition,
    InvalidArgument,
    Message,
    PopMessage,
    Producer,
    SimpleConsumer,
)
from tide.waiting import wait_until

SHORT_MS = 300


def receive_until(consumer: SimpleConsumer, count: int, max_messages: int = 16) -> list[PopMessage]:
    got: list[PopMessage] = []
    wait_until(
        lambda: len(got.__iadd__(consumer.receive(max_messages))) >= count,
        f"{count} messages received",
        state=lambda: len(got),
    )
    return got


def test_receive_and_ack_every_message_of_two_brokers(cluster: Cluster) -> None:
    topic = "T_simple_all"
    cluster.create_topic(topic, queues=2)
    with Producer(cluster.gateway.listen) as producer:
        sent = [producer.send(topic, f"m{i}".encode()) for i in range(40)]  # round robin
    ids = {result.msg_id for result in sent}
    assert {result.queue.broker_name for result in sent} == {"broker-a", "broker-b"}
    with SimpleConsumer(
        "G_simple_all", topic, gateway=cluster.gateway.listen, await_duration_ms=1_000
    ) as consumer:
        got = receive_until(consumer, 40)
        assert {m.msg_id for m in got} == ids
        assert {m.message.queue.broker_name for m in got} == {"broker-a", "broker-b"}
        assert consumer.ack_many(got) == [None] * 40
        assert consumer.lag().inflight == 0 and consumer.lag().ready == 0


def test_change_invisible_duration_redelivers_and_spends_the_old_handle(cluster: Cluster) -> None:
    topic = "T_simple_change"
    cluster.create_topic(topic, queues=1)
    with Producer(cluster.gateway.listen) as producer:
        (sent,) = producer.send_batch([Message(topic, b"x", keys=["k1"])])
    with SimpleConsumer(
        "G_simple_change", topic, gateway=cluster.gateway.listen, await_duration_ms=1_000
    ) as consumer:
        (first,) = receive_until(consumer, 1)
        moved = consumer.change_invisible_duration(first, SHORT_MS)
        assert moved.receipt_handle != first.receipt_handle
        with pytest.raises(InvalidArgument):
            consumer.ack(first)
        (again,) = receive_until(consumer, 1)
        assert again.delivery_attempt == 2 and again.msg_id == sent.msg_id
        assert again.message.topic == topic and again.message.keys == ("k1",)
        with pytest.raises(FailedPrecondition):
            consumer.ack(moved)  # its invisible time passed
        consumer.ack(again)
        with pytest.raises(InvalidArgument):
            consumer.receive(16, invisible_duration_ms=5_000)


def test_forward_to_dead_letter(cluster: Cluster) -> None:
    topic = "T_simple_dlq"
    cluster.create_topic(topic, queues=1)
    with Producer(cluster.gateway.listen) as producer:
        producer.send_batch([Message(topic, b"bad")])
    with SimpleConsumer(
        "G_simple_dlq", topic, gateway=cluster.gateway.listen, await_duration_ms=1_000
    ) as consumer:
        (got,) = receive_until(consumer, 1)
        assert consumer.forward_to_dead_letter(got)
        with pytest.raises(InvalidArgument):
            consumer.ack(got)

"""The push consumer's retries against real processes: a failing callback's message comes
back from the group's retry topic with attempt 2, 3, ... and lands in the dead-letter
queue after the group's retry_max_times; a send-back that fails while the gateway is
down never loses the message.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._cluster import Cluster
from tests._service_process import free_port
from tide.client import ConsumeResult, Producer, PushConsumer, ReceivedMessage
from tide.format import DLQ_ORIGIN_TOPIC, ORIGIN_MESSAGE_ID, SCHEDULE_TOPIC, TIMER_TOPIC
from tide.v1 import gateway_pb2, storage_pb2
from tide.waiting import wait_until

WAIT_S = 60.0
BROKER = "broker-a"
FAST = {
    "heartbeat_interval_ms": 300,
    "rebalance_interval_ms": 200,
    "long_poll_timeout_ms": 1_000,
    "commit_interval_ms": 200,
    "consume_from": "first",
}
# Every level 1 s: attempt r waits level 3 + r, clamped to the table's last level.
SHORT_LEVELS = "1s 1s 1s 1s 1s"


@pytest.fixture
def short_levels_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(
        tmp_path, brokers=1, dispatch_args=("--message-delay-level", SHORT_LEVELS)
    ) as cluster:
        yield cluster


@pytest.fixture
def plain_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, brokers=1) as cluster:
        yield cluster


def browse(cluster: Cluster, topic: str, queue_id: int) -> list[storage_pb2.StoredMessage]:
    """Every message of (topic, queue) on broker-a; none while the topic has no route."""
    found: list[storage_pb2.StoredMessage] = []
    offset = 0
    while True:
        try:
            answer = cluster.gateway.stub.BrowseQueue(
                gateway_pb2.PullRequest(
                    topic=topic, broker_name=BROKER, queue_id=queue_id, offset=offset
                ),
                timeout=WAIT_S,
            )
        except Exception as exc:  # grpc.RpcError: a topic whose route is not there yet
            if "NOT_FOUND" in str(exc):
                return found
            raise
        found.extend(answer.messages)
        if answer.next_offset <= offset or answer.next_offset >= answer.max_offset:
            return found
        offset = answer.next_offset


def test_a_failing_message_comes_back_with_each_attempt_then_is_dead_lettered(
    short_levels_cluster: Cluster,
) -> None:
    cluster = short_levels_cluster
    topic, group = "T_push_attempts", "G_push_attempts"
    cluster.create_topic(topic, queues=1)
    cluster.brokers[0].storage.stub.UpsertGroup(
        storage_pb2.UpsertGroupRequest(
            group=storage_pb2.GroupConfig(group_name=group, consume_enable=True, retry_max_times=3)
        ),
        timeout=WAIT_S,
    )
    seen: list[tuple[str, int, int, str, bytes, tuple[str, ...], str]] = []
    lock = threading.Lock()

    def callback(message: ReceivedMessage) -> ConsumeResult:
        key = message.keys[0]
        with lock:
            seen.append(
                (
                    key,
                    message.attempt,
                    message.reconsume_times,
                    message.topic,
                    message.body,
                    message.keys,
                    message.properties.get("color", ""),
                )
            )
            flaky_attempts = sum(1 for s in seen if s[0] == "flaky")
        if key == "poison" or (key == "flaky" and flaky_attempts < 2):
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    with Producer(cluster.gateway.listen) as producer:
        poison = producer.send(topic, b"p", keys=["poison"], properties={"color": "red"})
        producer.send(topic, b"f", keys=["flaky"], properties={"color": "blue"})
    with PushConsumer(group, topic, "*", callback, cluster.gateway.listen, **FAST) as consumer:  # type: ignore[arg-type]
        # 1 delivery + 3 retries, then the dead-letter queue.
        wait_until(lambda: len(browse(cluster, f"%DLQ%{group}", 0)) == 1, "the dead letter", WAIT_S)
        assert consumer.retry_assignment()
    with lock:
        poison_seen = [s for s in seen if s[0] == "poison"]
        flaky_seen = [s for s in seen if s[0] == "flaky"]
    assert [(s[1], s[2]) for s in poison_seen] == [(1, 0), (2, 1), (3, 2), (4, 3)]
    # Every attempt shows the original topic, body, keys and properties.
    assert {(s[3], s[4], s[5], s[6]) for s in poison_seen} == {(topic, b"p", ("poison",), "red")}
    assert [(s[1], s[3], s[6]) for s in flaky_seen] == [(1, topic, "blue"), (2, topic, "blue")]
    (dead,) = browse(cluster, f"%DLQ%{group}", 0)
    assert dead.properties[DLQ_ORIGIN_TOPIC] == topic
    assert dead.properties["UNIQ_KEY"] == poison.unique_key


def test_a_send_back_failing_while_the_gateway_is_down_loses_nothing(
    plain_cluster: Cluster,
) -> None:
    cluster = plain_cluster
    topic, group = "T_push_outage", "G_push_outage"
    cluster.create_topic(topic, queues=1)
    port = free_port()
    listen = f"127.0.0.1:{port}"
    cluster.restart_gateway("--listen", listen)  # a fixed port: the same after a restart
    entered = threading.Event()
    release = threading.Event()
    calls: list[str] = []
    lock = threading.Lock()

    def callback(message: ReceivedMessage) -> None:
        with lock:
            calls.append(message.keys[0])
        if message.keys[0] == "fragile":
            if not entered.is_set():
                entered.set()
                assert release.wait(WAIT_S)
            raise RuntimeError("cannot handle it")

    with Producer(listen) as producer:
        fragile = producer.send(topic, b"x", keys=["fragile"])
        producer.send(topic, b"y", keys=["after"])
    options = {**FAST, "retry_backoff_ms": 50}
    with PushConsumer(group, topic, "*", callback, listen, **options):  # type: ignore[arg-type]
        assert entered.wait(WAIT_S)
        cluster.gateway.stop()  # the send-back of the failure finds no gateway
        release.set()

        def fragile_calls() -> int:
            with lock:
                return calls.count("fragile")

        # Consumed again between failed send-backs; the queue does not move past it.
        wait_until(lambda: fragile_calls() >= 3, "the message consumed again", WAIT_S)
        with lock:
            assert "after" not in calls
        cluster.restart_gateway("--listen", listen)
        wait_until(lambda: "after" in calls, "the queue moving on", WAIT_S)
        # It was sent back: the retry copy waits in the schedule topic (level 3).

        def copies() -> list[storage_pb2.StoredMessage]:
            return [
                m
                for m in browse(cluster, SCHEDULE_TOPIC, 2)
                if m.properties.get(ORIGIN_MESSAGE_ID) == fragile.msg_id
            ]

        wait_until(copies, "the retry copy in the schedule topic", WAIT_S)
        (copy,) = copies()
        assert copy.properties["UNIQ_KEY"] == fragile.unique_key


def test_an_exponential_policy_retries_through_the_timer(
    short_levels_cluster: Cluster,
) -> None:
    """A group with RocketMQ 5's EXPONENTIAL policy (here 1 s doubling): each retry waits
    in the timer (not the delay levels) for its delay, measured from the failure by the
    store clocks, and the message is dead-lettered after retry_max_times."""
    cluster = short_levels_cluster
    topic, group = "T_push_exponential", "G_push_exponential"
    cluster.create_topic(topic, queues=1)
    policy = storage_pb2.RetryPolicy(
        type=storage_pb2.RetryPolicy.EXPONENTIAL, initial_ms=1_000, max_ms=4_000, multiplier=2
    )
    cluster.brokers[0].storage.stub.UpsertGroup(
        storage_pb2.UpsertGroupRequest(
            group=storage_pb2.GroupConfig(
                group_name=group, consume_enable=True, retry_max_times=2, retry_policy=policy
            )
        ),
        timeout=WAIT_S,
    )
    seen: list[ReceivedMessage] = []
    lock = threading.Lock()

    def callback(message: ReceivedMessage) -> ConsumeResult:
        with lock:
            seen.append(message)
        return ConsumeResult.RECONSUME_LATER

    with Producer(cluster.gateway.listen) as producer:
        sent = producer.send(topic, b"e", keys=["exp"])
    with PushConsumer(group, topic, "*", callback, cluster.gateway.listen, **FAST):  # type: ignore[arg-type]
        wait_until(lambda: len(browse(cluster, f"%DLQ%{group}", 0)) == 1, "the dead letter", WAIT_S)
    with lock:
        attempts = list(seen)
    assert [m.attempt for m in attempts] == [1, 2, 3]
    assert {m.unique_key for m in attempts} == {sent.unique_key}
    # Attempt r waits 1 s * 2 ** (r - 1) after the failure before it (the timer fires at
    # or after the time; the send-back's store time is after the failure).
    for before, after, delay_ms in zip(attempts, attempts[1:], (1_000, 2_000), strict=False):
        assert after.store_timestamp_ms >= before.store_timestamp_ms + delay_ms
    timer_copies = [
        m
        for m in browse(cluster, TIMER_TOPIC, 0)
        if m.properties.get(ORIGIN_MESSAGE_ID) == sent.msg_id
    ]
    assert len(timer_copies) == 2  # both retries went through the timer

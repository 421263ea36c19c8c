"""PushConsumer group behaviour against a real cluster of two brokers."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from tests._cluster import Cluster
from tide.client import (
    Admin,
    InvalidArgument,
    MessageQueue,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
    TopicNotFound,
)
from tide.client._push_options import push_options
from tide.v1 import gateway_pb2
from tide.waiting import wait_until

WAIT_S = 60.0
QUEUES_PER_BROKER = 4
FAST = {
    "heartbeat_interval_ms": 300,
    "rebalance_interval_ms": 200,
    "long_poll_timeout_ms": 2_000,
    "commit_interval_ms": 200,
}


class Recorder:
    """Every delivery: (member, queue, offset, key), thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deliveries: list[tuple[str, MessageQueue, int, str]] = []

    def callback(self, member: str) -> object:
        def record(message: ReceivedMessage) -> None:
            with self.lock:
                self.deliveries.append(
                    (member, message.queue, message.queue_offset, message.keys[0])
                )

        return record

    def count(self) -> int:
        with self.lock:
            return len(self.deliveries)

    def members(self) -> Counter[str]:
        with self.lock:
            return Counter(member for member, *_ in self.deliveries)

    def keys(self) -> Counter[str]:
        with self.lock:
            return Counter(key for *_, key in self.deliveries)


def consumer(
    cluster: Cluster, group: str, topic: str, recorder: Recorder, member: str, **kwargs: object
) -> PushConsumer:
    options: dict[str, object] = {**FAST, "consume_from": "first", **kwargs}
    return PushConsumer(
        group,
        topic,
        "*",
        recorder.callback(member),  # type: ignore[arg-type]
        cluster.gateway.listen,
        client_id=f"{group}-{member}",
        **options,  # type: ignore[arg-type]
    )


def test_two_members_each_message_once_with_a_member_leaving_halfway(cluster: Cluster) -> None:
    topic, group = "T_push_group", "G_push_group"
    cluster.create_topic(topic, queues=QUEUES_PER_BROKER)
    total = 2 * QUEUES_PER_BROKER
    recorder = Recorder()
    first = consumer(cluster, group, topic, recorder, "a").start()
    second = consumer(cluster, group, topic, recorder, "b")
    try:
        wait_until(lambda: len(first.assignment()) == total, "a owns every queue", WAIT_S)
        second.start()
        wait_until(
            lambda: len(first.assignment()) == len(second.assignment()) == total // 2,
            "the queues split 4 / 4",
            WAIT_S,
        )
        assert not set(first.assignment()) & set(second.assignment())
        with Admin(cluster.gateway.listen) as admin:
            assert admin.consumers(group) == [f"{group}-a", f"{group}-b"]

        count = 400
        sent: dict[str, tuple[MessageQueue, int]] = {}
        stop_at = threading.Event()

        def produce() -> None:
            with Producer(cluster.gateway.listen) as producer:
                for i in range(count):
                    result = producer.send(topic, b"m", keys=[f"key-{i}"])
                    sent[f"key-{i}"] = (result.queue, result.queue_offset)
                    if i == count // 2:
                        stop_at.set()

        producing = threading.Thread(target=produce)
        producing.start()
        assert stop_at.wait(WAIT_S)
        wait_until(lambda: recorder.members()["a"] > 0, "a consumed something", WAIT_S)
        first.shutdown()  # commits its queues, then leaves: b takes them at once
        producing.join(WAIT_S)
        assert len(sent) == count
        wait_until(lambda: len(second.assignment()) == total, "b owns every queue", WAIT_S)
        wait_until(lambda: recorder.count() >= count, "every message consumed", WAIT_S)
    finally:
        first.shutdown()
        second.shutdown()

    keys = recorder.keys()
    assert set(keys) == set(sent), "every message consumed"
    assert [k for k, n in keys.items() if n > 1] == [], "no message consumed twice"
    assert len(recorder.deliveries) == count
    # some queue was handed over mid-stream: consumed by a, then (from a's commit) by b
    members_by_queue: dict[MessageQueue, set[str]] = {}
    for member, queue, _, _ in recorder.deliveries:
        members_by_queue.setdefault(queue, set()).add(member)
    assert any(members == {"a", "b"} for members in members_by_queue.values())
    # the deliveries are exactly the (queue, offset) positions the sends reported
    assert {(q, o) for _, q, o, _ in recorder.deliveries} == set(sent.values())
    # b's shutdown committed every queue to its end, so the group has no lag
    with PullConsumer(group, cluster.gateway.listen) as pull:
        for queue in pull.queues(topic):
            assert pull.committed(queue) == pull.max_offset(queue)
        # and b left the group
        with Admin(cluster.gateway.listen) as admin:
            assert admin.consumers(group) == []


def test_a_restarted_group_continues_from_its_committed_offsets(cluster: Cluster) -> None:
    topic, group = "T_push_restart", "G_push_restart"
    cluster.create_topic(topic, queues=2)
    recorder = Recorder()
    with Producer(cluster.gateway.listen) as producer:
        for i in range(20):
            producer.send(topic, b"m", keys=[f"old-{i}"])
    with consumer(cluster, group, topic, recorder, "a"):
        wait_until(lambda: recorder.count() >= 20, "the first 20", WAIT_S)
    with Producer(cluster.gateway.listen) as producer:
        for i in range(10):
            producer.send(topic, b"m", keys=[f"new-{i}"])
    with consumer(cluster, group, topic, recorder, "a2"):
        wait_until(lambda: recorder.count() >= 30, "the next 10", WAIT_S)
    keys = recorder.keys()
    assert len(keys) == 30
    assert max(keys.values()) == 1


def test_consume_from_last_skips_what_was_there(cluster: Cluster) -> None:
    topic, group = "T_push_last", "G_push_last"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    recorder = Recorder()
    with (
        Producer(cluster.gateway.listen) as producer,
        PullConsumer(group, cluster.gateway.listen) as pull,
    ):
        producer.send(topic, b"m", keys=["before"])
        [queue] = pull.queues(topic)
        wait_until(lambda: pull.max_offset(queue) == 1, "dispatched", WAIT_S)
        with consumer(cluster, group, topic, recorder, "a", consume_from="last") as member:
            wait_until(lambda: len(member.assignment()) == 1, "the queue taken", WAIT_S)
            # the start position (the end) is committed before the first long poll
            wait_until(lambda: pull.committed(queue) == 1, "start committed", WAIT_S)
            producer.send(topic, b"m", keys=["after"])
            wait_until(lambda: recorder.count() >= 1, "the new message", WAIT_S)
    assert recorder.keys() == Counter({"after": 1})


def test_orderly_a_failing_callback_is_retried_then_dead_lettered(cluster: Cluster) -> None:
    topic, group = "T_push_retry", "G_push_retry"
    cluster.create_topic(topic, queues=1, brokers=["broker-b"])
    attempts: Counter[str] = Counter()
    lock = threading.Lock()

    def callback(message: ReceivedMessage) -> None:
        key = message.keys[0]
        with lock:
            attempts[key] += 1
            count = attempts[key]
        if key == "poison" or (key == "flaky" and count < 2):
            raise RuntimeError(f"cannot handle {key}")

    with Producer(cluster.gateway.listen) as producer:
        for key in ("ok-1", "flaky", "poison", "ok-2"):
            producer.send(topic, b"m", keys=[key])
    options = {
        **FAST,
        "consume_from": "first",
        "max_retries": 2,
        "retry_backoff_ms": 10,
        "orderly": True,
    }
    with PushConsumer(
        group,
        topic,
        "*",
        callback,
        cluster.gateway.listen,
        **options,  # type: ignore[arg-type]
    ):
        wait_until(lambda: attempts["ok-2"] == 1, "the message after the poison", WAIT_S)
    assert attempts == Counter({"ok-1": 1, "flaky": 2, "poison": 3, "ok-2": 1})
    # The poison went to the group's dead-letter queue (write-only: browsed).
    dead = cluster.gateway.stub.BrowseQueue(
        gateway_pb2.PullRequest(topic=f"%DLQ%{group}", broker_name="broker-b", queue_id=0),
        timeout=WAIT_S,
    )
    assert [list(m.keys) for m in dead.messages] == [["poison"]]
    assert dead.messages[0].properties["DLQ_ORIGIN_TOPIC"] == topic


def test_unknown_topic_fails_at_start(cluster: Cluster) -> None:
    member = PushConsumer("G_push_missing", "T_push_missing", "*", print, cluster.gateway.listen)
    with pytest.raises(TopicNotFound, match="T_push_missing"):
        member.start()
    # the failed start left the group again and closed
    with Admin(cluster.gateway.listen) as admin:
        assert admin.consumers("G_push_missing") == []
    member.shutdown()  # idempotent


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_messages": 33}, r"min_messages is 33; give 0..max_messages \(32\)"),
        (
            {"min_messages": -1, "max_messages": 8},
            r"min_messages is -1; give 0..max_messages \(8\)",
        ),
        ({"min_messages_wait_ms": 30_001}, r"min_messages_wait_ms is 30001; give 0..30000"),
    ],
)
def test_fuller_pull_options_are_checked(options: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        PushConsumer("G_opts", "T_opts", "*", lambda m: None, "127.0.0.1:1", **options)  # type: ignore[arg-type]


def test_retry_topic_pulls_never_wait_for_more() -> None:
    options = push_options(
        "G_fuller",
        "T_fuller",
        "*",
        consume_from="last",
        client_id=None,
        heartbeat_interval_ms=1_000,
        rebalance_interval_ms=1_000,
        takeover_delay_ms=None,
        long_poll_timeout_ms=1_000,
        max_messages=64,
        min_messages=32,
        min_messages_wait_ms=50,
        commit_interval_ms=1_000,
        max_retries=1,
        retry_backoff_ms=1,
        max_queues=4,
        release_timeout_ms=1_000,
        orderly=False,
        max_reconsume_times=0,
        lock_interval_ms=1_000,
    )
    settings, retry = options.settings, options.retry_settings
    assert (settings.min_messages, settings.min_messages_wait_ms) == (32, 50)
    assert (retry.min_messages, retry.min_messages_wait_ms) == (0, 0)

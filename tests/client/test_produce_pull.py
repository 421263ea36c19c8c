"""Producer and PullConsumer against a real cluster of two brokers."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from tests._cluster import Cluster
from tide.client import (
    Admin,
    InvalidArgument,
    Message,
    MessageQueue,
    NotFound,
    Producer,
    PullConsumer,
    PullResult,
    PullStatus,
    SendResult,
    TopicNotFound,
)
from tide.waiting import wait_until

LONG_POLL_MS = 20_000
BROKERS = ["broker-a", "broker-b"]


def wait_dispatched(
    cluster: Cluster, consumer: PullConsumer, queues: list[MessageQueue], count: int
) -> None:
    """Dispatch builds consume queues after the store write: wait until ``count`` messages
    are in ``queues``."""
    wait_until(lambda: sum(consumer.max_offset(q) for q in queues) >= count, f"{count} dispatched")


def drain(consumer: PullConsumer, queue: MessageQueue, offset: int = 0) -> list[PullResult]:
    results = []
    while True:
        result = consumer.pull(queue, offset, max_messages=7)
        results.append(result)
        if result.status is PullStatus.NO_NEW_MESSAGE:
            return results
        offset = result.next_offset


def test_produce_and_pull_across_two_brokers(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    with Admin(gateway) as admin:
        assert sorted(admin.create_topic("T_across", read_queue_nums=3)) == BROKERS
        assert "T_across" in admin.list_topics()
    sent = {}
    with Producer(gateway) as producer:
        for i in range(30):
            result = producer.send(
                "T_across", f"body {i}", tags="TagA", keys=[f"k{i}"], properties={"n": str(i)}
            )
            sent[f"k{i}"] = result
        batch = producer.send_batch(
            [Message("T_across", b"batch %d" % i, keys=[f"b{i}"]) for i in range(10)]
        )
        futures: list[Future[SendResult]] = [
            producer.send_async("T_across", b"async", keys=[f"a{i}"]) for i in range(10)
        ]
        sent.update({f"b{i}": r for i, r in enumerate(batch)})
        sent.update({f"a{i}": f.result() for i, f in enumerate(futures)})
    assert {r.queue.broker_name for r in sent.values()} == set(BROKERS)
    with PullConsumer("G_across", gateway) as consumer:
        queues = consumer.queues("T_across")
        assert [(q.broker_name, q.queue_id) for q in queues] == [
            (b, i) for b in BROKERS for i in range(3)
        ]
        wait_dispatched(cluster, consumer, queues, len(sent))
        received = {}
        for queue in queues:
            for pulled in drain(consumer, queue):
                for message in pulled.messages:
                    assert message.queue == queue
                    [key] = message.keys
                    assert key not in received
                    received[key] = message
    assert received.keys() == sent.keys()
    for key, result in sent.items():
        message = received[key]
        assert (message.queue, message.queue_offset) == (result.queue, result.queue_offset)
        assert message.msg_id == result.msg_id
        assert message.unique_key == result.unique_key
    assert received["k7"].body == b"body 7"
    assert received["k7"].tags == "TagA"
    assert received["k7"].properties["n"] == "7"


def test_sharding_key_and_explicit_queue(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_route", queues=4)
    with Producer(gateway) as producer:
        queues = {producer.send("T_route", b"x", sharding_key="order-1").queue for _ in range(5)}
        assert len(queues) == 1
        target = MessageQueue("T_route", "broker-b", 3)
        assert producer.send("T_route", b"y", queue=target).queue == target
        with pytest.raises(NotFound) as caught:
            producer.send("T_route", b"z", queue=MessageQueue("T_route", "broker-b", 9))
        assert not isinstance(caught.value, TopicNotFound)


def test_errors(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    with Producer(gateway) as producer:
        with pytest.raises(TopicNotFound, match="T_missing"):
            producer.send("T_missing", b"x")
        with pytest.raises(InvalidArgument, match="contains ' '"):
            producer.send("bad topic", b"x")
    with PullConsumer("G_errors", gateway) as consumer, pytest.raises(TopicNotFound):
        consumer.queues("T_missing")


def test_tag_filter(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_tags", queues=1, brokers=["broker-a"])
    with Producer(gateway) as producer:
        for tag in ("A", "B", "C", "A"):
            producer.send("T_tags", tag.encode(), tags=tag)
    with PullConsumer("G_tags", gateway) as consumer:
        [queue] = consumer.queues("T_tags")
        wait_dispatched(cluster, consumer, [queue], 4)
        result = consumer.pull(queue, 0, expression="A || C")
        assert [m.body for m in result.messages] == [b"A", b"C", b"A"]
        assert result.next_offset == 4


def test_long_poll_is_answered_soon_after_a_send(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_poll", queues=1, brokers=["broker-a"])
    queue = MessageQueue("T_poll", "broker-a", 0)
    answers: list[PullResult] = []
    with PullConsumer("G_poll", gateway, rpc_timeout_ms=30_000) as consumer:
        idle = consumer.pull(queue, 0, long_poll_timeout_ms=200)  # nothing there: waits, then
        assert idle.status is PullStatus.NO_NEW_MESSAGE

        def poll() -> None:
            answers.append(consumer.pull(queue, 0, long_poll_timeout_ms=LONG_POLL_MS))

        started = time.monotonic()
        puller = threading.Thread(target=poll)
        puller.start()
        cluster.gateway.wait_held(1)  # the pull reached the gateway and waits there
        with Producer(gateway) as producer:
            producer.send("T_poll", b"wake up")
        puller.join(LONG_POLL_MS / 1000 + 10)
        elapsed_s = time.monotonic() - started
    [answer] = answers
    # Answered by the arrival, not by the 20 s timeout (which would say NO_NEW_MESSAGE).
    assert answer.status is PullStatus.FOUND
    assert [m.body for m in answer.messages] == [b"wake up"]
    assert elapsed_s < LONG_POLL_MS / 1000


def test_fuller_pulls_wait_for_min_messages(cluster: Cluster) -> None:
    """The pull's min_messages and its wait reach the gateway (its semantics:
    tests/services/gateway/test_fuller_pulls.py); out of bounds, nothing is sent."""
    gateway = cluster.gateway.listen
    cluster.create_topic("T_fuller", queues=1, brokers=["broker-a"])
    queue = MessageQueue("T_fuller", "broker-a", 0)
    with Producer(gateway) as producer, PullConsumer("G_fuller", gateway) as consumer:
        producer.send("T_fuller", b"one")
        wait_dispatched(cluster, consumer, [queue], 1)
        wait_ms = 300
        started = time.monotonic()
        result = consumer.pull(queue, 0, min_messages=2, min_messages_wait_ms=wait_ms)
        # Held for the second message that never came: answered at the wait's end.
        assert time.monotonic() - started >= wait_ms / 1000
        assert [m.body for m in result.messages] == [b"one"]
        with pytest.raises(InvalidArgument, match=r"min_messages is 8; give 0..max_messages \(7\)"):
            consumer.pull(queue, 0, max_messages=7, min_messages=8)
        with pytest.raises(InvalidArgument, match="min_messages_wait_ms is -1"):
            consumer.pull(queue, 0, min_messages=2, min_messages_wait_ms=-1)


def test_offsets_commit_and_search(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_offsets", queues=1, brokers=["broker-b"])
    queue = MessageQueue("T_offsets", "broker-b", 0)
    with Producer(gateway) as producer:
        first = [producer.send("T_offsets", b"early %d" % i) for i in range(3)]
        # A store-time boundary between the two halves (the storage's clock is this one).
        last_early_ms = max(result.store_timestamp_ms for result in first)
        wait_until(lambda: time.time() * 1000 >= last_early_ms + 1, "the clock past the first half")
        later = [producer.send("T_offsets", b"late %d" % i) for i in range(2)]
    with PullConsumer("G_offsets", gateway) as consumer:
        wait_dispatched(cluster, consumer, [queue], 5)
        offsets = consumer.offsets(queue)
        assert (offsets.min_offset, offsets.max_offset) == (0, 5)
        assert consumer.committed(queue) == -1
        consumer.commit(queue, 3)
        assert consumer.committed(queue) == 3
        boundary = later[0].store_timestamp_ms
        assert boundary > first[-1].store_timestamp_ms
        assert consumer.search_offset(queue, boundary) == 3
        result = consumer.pull(queue, 99)
        assert result.status is PullStatus.OFFSET_ILLEGAL
        assert result.next_offset == 5

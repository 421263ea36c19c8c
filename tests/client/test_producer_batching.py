"""The Producer's accumulation (``send``/``send_async`` from many threads share Produce
calls within ``linger_ms``) against a real cluster of two brokers: exact per-message
results, failures confined to the messages they concern, the linger bound, close()."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from tests._cluster import Cluster
from tide.client import (
    Admin,
    InvalidArgument,
    MessageQueue,
    NotFound,
    Producer,
    PullConsumer,
    PullStatus,
    SendResult,
    TopicNotFound,
)
from tide.waiting import wait_until

RESULT_TIMEOUT_S = 30.0
# Long enough that only a full batch (or close) can send before the test is over.
LONG_LINGER_MS = 60_000
THREADS = 16
SENDS_PER_THREAD = 25


def create(cluster: Cluster, topic: str, queues: int = 2) -> None:
    with Admin(cluster.gateway.listen) as admin:
        admin.create_topic(topic, read_queue_nums=queues)


def stored_bodies(
    cluster: Cluster, topic: str, count: int
) -> dict[tuple[MessageQueue, int], bytes]:
    """Every stored message of ``topic`` by (queue, queue offset)."""
    stored: dict[tuple[MessageQueue, int], bytes] = {}
    with PullConsumer("G_batching", cluster.gateway.listen) as consumer:
        queues = consumer.queues(topic)
        wait_until(lambda: sum(consumer.max_offset(q) for q in queues) >= count, "dispatched")
        for queue in queues:
            offset = 0
            while True:
                pulled = consumer.pull(queue, offset, max_messages=64)
                if pulled.status is PullStatus.NO_NEW_MESSAGE:
                    break
                for message in pulled.messages:
                    stored[(queue, message.queue_offset)] = message.body
                offset = pulled.next_offset
    return stored


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_many_threads_share_calls_and_each_gets_its_own_result(
    cluster: Cluster, stream: bool
) -> None:
    """16 threads each send() and send_async(): fewer calls than messages, and each
    result names where its own body is stored."""
    topic = f"T_batching_threads_{stream}"
    create(cluster, topic)
    sent: dict[bytes, SendResult] = {}
    lock = threading.Lock()
    with Producer(cluster.gateway.listen, stream=stream, linger_ms=20) as producer:

        def work(thread: int) -> None:
            for i in range(SENDS_PER_THREAD):
                body = f"t{thread} m{i}".encode()
                if i % 2:
                    result = producer.send_async(topic, body).result(RESULT_TIMEOUT_S)
                else:
                    result = producer.send(topic, body)
                with lock:
                    sent[body] = result

        threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        accumulator = producer._accumulator
        total = THREADS * SENDS_PER_THREAD
        assert accumulator.messages_sent == total
        assert accumulator.calls_sent < total  # threads shared calls
    assert len(sent) == total
    assert len({r.msg_id for r in sent.values()}) == total
    stored = stored_bodies(cluster, topic, total)
    assert len(stored) == total
    for body, result in sent.items():
        assert stored[(result.queue, result.queue_offset)] == body
    assert producer._in_flight.sends == 0 and producer._in_flight.bytes == 0


def test_a_refused_message_fails_only_its_own_future(cluster: Cluster) -> None:
    """One batch holds a message for a queue that does not exist (the gateway refuses the
    whole call naming it): that future fails NotFound with the gateway's reason, the
    others of the batch are written; a missing topic fails each of its futures."""
    topic = "T_batching_refused"
    create(cluster, topic)
    with Producer(
        cluster.gateway.listen, linger_ms=LONG_LINGER_MS, batch_max_messages=5
    ) as producer:
        futures = [producer.send_async(topic, f"good {i}") for i in range(2)]
        bad = producer.send_async(topic, "bad", queue=MessageQueue(topic, "broker-b", 9))
        futures += [producer.send_async(topic, f"good {i}") for i in range(2, 4)]  # full
        missing = [producer.send_async("T_batching_missing", f"m{i}") for i in range(3)]
        with pytest.raises(NotFound, match="queue") as caught:
            bad.result(RESULT_TIMEOUT_S)
        assert not isinstance(caught.value, TopicNotFound)
        results = [f.result(RESULT_TIMEOUT_S) for f in futures]
        assert all(r.written for r in results)
        assert len({r.msg_id for r in results}) == 4
    for future in missing:  # close() sent their batch
        with pytest.raises(TopicNotFound, match="T_batching_missing"):
            future.result(RESULT_TIMEOUT_S)


def test_a_lone_message_goes_after_the_linger(cluster: Cluster) -> None:
    """A lone send() returns though its batch could take 1,024 messages: it went alone."""
    topic = "T_batching_lone"
    create(cluster, topic)
    with Producer(cluster.gateway.listen, linger_ms=50, batch_max_messages=1024) as producer:
        result = producer.send(topic, b"alone")
        assert result.written
        assert (producer._accumulator.calls_sent, producer._accumulator.messages_sent) == (1, 1)


def test_a_blocking_send_does_not_wait_out_the_linger(cluster: Cluster) -> None:
    """send() with a 60 s linger returns within the result timeout (30 s): no other
    send() is on its way, so its batch goes at once."""
    topic = "T_batching_sync"
    create(cluster, topic)
    results: list[SendResult] = []
    with Producer(cluster.gateway.listen, linger_ms=LONG_LINGER_MS) as producer:
        sender = threading.Thread(target=lambda: results.append(producer.send(topic, b"now")))
        sender.start()
        sender.join(RESULT_TIMEOUT_S)
        assert not sender.is_alive()
        assert [r.written for r in results] == [True]


def test_a_full_batch_goes_without_waiting_for_the_linger(cluster: Cluster) -> None:
    topic = "T_batching_full"
    create(cluster, topic)
    with Producer(
        cluster.gateway.listen, linger_ms=LONG_LINGER_MS, batch_max_messages=10
    ) as producer:
        futures = [producer.send_async(topic, f"m{i}") for i in range(10)]
        results = [f.result(RESULT_TIMEOUT_S) for f in futures]
        assert producer._accumulator.calls_sent == 1
    assert len({r.queue for r in results}) == 1  # one call: the topic's next queue
    assert [r.queue_offset for r in results] == list(
        range(results[0].queue_offset, results[0].queue_offset + 10)
    )


def test_close_sends_what_is_accumulated(cluster: Cluster) -> None:
    topic = "T_batching_close"
    create(cluster, topic)
    producer = Producer(cluster.gateway.listen, linger_ms=LONG_LINGER_MS)
    futures: list[Future[SendResult]] = [producer.send_async(topic, f"m{i}") for i in range(5)]
    assert not any(f.done() for f in futures)  # lingering
    cancelled = producer.send_async(topic, "never")
    assert cancelled.cancel()
    producer.close()
    assert all(f.result(0).written for f in futures)
    assert producer._accumulator.messages_sent == 5  # not the cancelled one
    with pytest.raises(Exception, match="closed"):
        producer.send(topic, b"late")


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("linger_ms", -1, "linger_ms is -1; give 0..60000"),
        ("batch_max_messages", 0, "batch_max_messages is 0; give 1..1024"),
        ("batch_max_bytes", 10, "batch_max_bytes is 10; give 1024.."),
    ],
)
def test_batching_options_are_checked(option: str, value: int, error: str) -> None:
    with pytest.raises(InvalidArgument, match=error):
        Producer(**{option: value})  # type: ignore[arg-type]


def test_a_message_over_batch_max_bytes_goes_alone(cluster: Cluster) -> None:
    topic = "T_batching_big"
    create(cluster, topic)
    with Producer(
        cluster.gateway.listen, linger_ms=LONG_LINGER_MS, batch_max_bytes=1024
    ) as producer:
        small = producer.send_async(topic, b"x" * 600)
        big = producer.send_async(topic, b"y" * 2000)  # closes the small one's batch
        assert big.result(RESULT_TIMEOUT_S).written
        assert small.result(RESULT_TIMEOUT_S).written
        assert producer._accumulator.calls_sent == 2

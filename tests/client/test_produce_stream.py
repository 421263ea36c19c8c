"""The Producer's pipelined mode (``stream=True``: async sends on one ProduceStream) and
``send_batch_async`` against a real cluster of two brokers."""

from __future__ import annotations

from collections import Counter

import pytest

from tests._cluster import Cluster
from tests._service_process import free_port
from tide.client import (
    Admin,
    InvalidArgument,
    Message,
    Producer,
    PullConsumer,
    RetryPolicy,
    SendStatus,
    TideError,
    TopicNotFound,
    Unavailable,
)
from tide.waiting import wait_until

RESULT_TIMEOUT_S = 30.0


def create(cluster: Cluster, topic: str, queues: int = 2) -> None:
    with Admin(cluster.gateway.listen) as admin:
        admin.create_topic(topic, read_queue_nums=queues)


def test_pipelined_sends_are_all_written_once(cluster: Cluster) -> None:
    create(cluster, "T_stream_many")
    with Producer(cluster.gateway.listen, stream=True, max_in_flight=64) as producer:
        batches = [
            producer.send_batch_async([Message("T_stream_many", f"b{b}m{m}") for m in range(20)])
            for b in range(100)
        ]
        singles = [producer.send_async("T_stream_many", f"single {i}") for i in range(50)]
        results = [r for f in batches for r in f.result(RESULT_TIMEOUT_S)]
        results += [f.result(RESULT_TIMEOUT_S) for f in singles]
    assert len(results) == 2050
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == 2050
    per_queue = Counter(r.queue for r in results)
    offsets: dict[object, list[int]] = {}
    for result in results:
        offsets.setdefault(result.queue, []).append(result.queue_offset)
    for queue, count in per_queue.items():
        assert sorted(offsets[queue]) == list(range(count))
    with PullConsumer("G_stream_many", cluster.gateway.listen) as consumer:
        queues = consumer.queues("T_stream_many")
        wait_until(lambda: sum(consumer.max_offset(q) for q in queues) >= 2050, "2050 dispatched")


def test_in_band_errors_fail_only_their_future(cluster: Cluster) -> None:
    create(cluster, "T_stream_errors")
    with Producer(cluster.gateway.listen, stream=True) as producer:
        good = producer.send_batch_async([Message("T_stream_errors", "a")])
        missing = producer.send_async("T_stream_no_such_topic", "x")
        after = producer.send_batch_async([Message("T_stream_errors", "b")] * 3)
        with pytest.raises(TopicNotFound, match="T_stream_no_such_topic"):
            missing.result(RESULT_TIMEOUT_S)
        assert len(good.result(RESULT_TIMEOUT_S)) == 1
        assert [r.status for r in after.result(RESULT_TIMEOUT_S)] == [SendStatus.SEND_OK] * 3
        # Client-side checks raise before anything is sent.
        with pytest.raises(InvalidArgument):
            producer.send_async("bad topic!", "x")
        assert producer.send_batch_async([]).result(RESULT_TIMEOUT_S) == []


def test_unary_send_batch_async_and_closed_producer(cluster: Cluster) -> None:
    create(cluster, "T_stream_unary")
    producer = Producer(cluster.gateway.listen)  # stream=False: a thread pool of calls
    future = producer.send_batch_async([Message("T_stream_unary", f"m{i}") for i in range(5)])
    assert len(future.result(RESULT_TIMEOUT_S)) == 5
    producer.close()
    streaming = Producer(cluster.gateway.listen, stream=True)
    streaming.close()
    with pytest.raises(TideError, match="closed"):
        streaming.send_async("T_stream_unary", "late")


def test_sends_are_retried_until_the_gateway_is_back(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A stopped gateway fails the stream; sends meanwhile are retried (RetryPolicy) and
    written by the gateway started again on the same port; without retries they fail
    Unavailable instead of hanging."""
    with Cluster(tmp_path_factory.mktemp("stream_restart"), brokers=1) as small:
        port = free_port()
        listen = f"127.0.0.1:{port}"
        small.restart_gateway("--listen", listen)
        create(small, "T_stream_restart")
        retry = RetryPolicy(max_attempts=10, initial_backoff_ms=200, max_backoff_ms=1000)
        with (
            Producer(listen, stream=True, retry=retry) as producer,
            Producer(listen, stream=True, retry=RetryPolicy(max_attempts=1)) as once,
        ):
            assert producer.send_async("T_stream_restart", "before").result(RESULT_TIMEOUT_S)
            assert once.send_async("T_stream_restart", "before").result(RESULT_TIMEOUT_S)
            small.gateway.stop()  # both streams end UNAVAILABLE (nothing was pending)
            with pytest.raises(Unavailable):
                once.send_async("T_stream_restart", "while down").result(RESULT_TIMEOUT_S)
            retried = [producer.send_async("T_stream_restart", f"down {i}") for i in range(5)]
            small.restart_gateway("--listen", listen)
            results = [future.result(RESULT_TIMEOUT_S) for future in retried]
        assert all(result.written for result in results)
        assert len({result.msg_id for result in results}) == 5


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_async_sends_are_bounded_by_bytes_as_well_as_count(cluster: Cluster, stream: bool) -> None:
    """Large async batches sent as fast as the producer takes them: the caller is held
    back once max_in_flight_bytes are unfinished (the count bound, 256, would let ~100 MiB
    in), and every send is written."""
    topic = f"T_stream_bytes_{stream}"
    create(cluster, topic)
    limit_bytes = 1 << 20
    body = b"x" * 60_000  # the test cluster takes bodies up to 64 KiB
    with Producer(
        cluster.gateway.listen, stream=stream, max_in_flight_bytes=limit_bytes
    ) as producer:
        futures = [
            producer.send_batch_async([Message(topic, body) for _ in range(6)])  # ~360 KB
            for _ in range(40)
        ]
        results = [r for f in futures for r in f.result(RESULT_TIMEOUT_S)]
        in_flight = producer._in_flight
        assert 0 < in_flight.peak_bytes <= limit_bytes
        assert in_flight.bytes == 0 and in_flight.sends == 0
    assert len(results) == 240 and all(r.status is SendStatus.SEND_OK for r in results)


def test_max_in_flight_bytes_is_checked() -> None:
    with pytest.raises(InvalidArgument, match="max_in_flight_bytes is 10; give 1048576"):
        Producer(max_in_flight_bytes=10)

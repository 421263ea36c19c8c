"""tide.client.aio's Producer with ``stream=True`` (sends pipelined on one ProduceStream)
against a real cluster (mirrors tests/client/test_produce_stream.py)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tests._cluster import Cluster
from tests._service_process import free_port
from tide.client import (
    InvalidArgument,
    Message,
    MessageQueue,
    RetryPolicy,
    SendResult,
    SendStatus,
    TideError,
    TopicNotFound,
    Unavailable,
)
from tide.client import PullConsumer as SyncPullConsumer
from tide.client.aio import Producer
from tide.waiting import wait_until


def test_pipelined_sends_are_all_written_once(cluster: Cluster) -> None:
    cluster.create_topic("T_aio_stream_many", queues=2)

    async def produce() -> list[SendResult]:
        async with Producer(cluster.gateway.listen, stream=True, max_in_flight=64) as producer:
            batches = [
                producer.send_batch([Message("T_aio_stream_many", f"b{b}m{m}") for m in range(20)])
                for b in range(50)
            ]
            singles = [producer.send("T_aio_stream_many", f"single {i}") for i in range(50)]
            done = await asyncio.gather(*batches)
            results = [r for batch in done for r in batch]
            results += await asyncio.gather(*singles)
            # Every call (the accumulated singles' batches too) went on the one stream.
            session = producer._stream._session if producer._stream else None
            assert session is not None and not session.broken
        return results

    results = asyncio.run(produce())
    assert len(results) == 1050
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == 1050
    offsets: dict[MessageQueue, list[int]] = {}
    for result in results:
        offsets.setdefault(result.queue, []).append(result.queue_offset)
    for queue, count in Counter(r.queue for r in results).items():
        assert sorted(offsets[queue]) == list(range(count))
    with SyncPullConsumer("G_aio_stream_many", cluster.gateway.listen) as consumer:
        queues = consumer.queues("T_aio_stream_many")
        wait_until(lambda: sum(consumer.max_offset(q) for q in queues) >= 1050, "1050 dispatched")


def test_in_band_errors_fail_only_their_send_and_closed_producer(cluster: Cluster) -> None:
    cluster.create_topic("T_aio_stream_errors", queues=2)

    async def run() -> None:
        producer = Producer(cluster.gateway.listen, stream=True)
        good, missing, after = await asyncio.gather(
            producer.send_batch([Message("T_aio_stream_errors", "a")]),
            producer.send("T_aio_stream_no_such_topic", "x"),
            producer.send_batch([Message("T_aio_stream_errors", "b")] * 3),
            return_exceptions=True,
        )
        assert isinstance(missing, TopicNotFound)
        assert "T_aio_stream_no_such_topic" in str(missing)
        assert isinstance(good, list) and len(good) == 1
        assert isinstance(after, list)
        assert [r.status for r in after] == [SendStatus.SEND_OK] * 3
        # Client-side checks raise before anything is sent.
        with pytest.raises(InvalidArgument):
            await producer.send("bad topic!", "x")
        assert await producer.send_batch([]) == []
        await producer.close()
        with pytest.raises(TideError, match="closed"):
            await producer.send("T_aio_stream_errors", "late")

    asyncio.run(run())


def test_sends_are_retried_until_the_gateway_is_back(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A stopped gateway breaks the stream; sends meanwhile are retried (RetryPolicy) and
    written by the gateway started again on the same port; without retries they fail
    Unavailable instead of hanging."""
    with Cluster(tmp_path_factory.mktemp("aio_stream_restart"), brokers=1) as small:
        listen = f"127.0.0.1:{free_port()}"
        small.restart_gateway("--listen", listen)
        small.create_topic("T_aio_stream_restart", queues=1)
        retry = RetryPolicy(max_attempts=10, initial_backoff_ms=200, max_backoff_ms=1000)

        async def run() -> list[SendResult]:
            async with (
                Producer(listen, stream=True, retry=retry) as producer,
                Producer(listen, stream=True, retry=RetryPolicy(max_attempts=1)) as once,
            ):
                assert (await producer.send("T_aio_stream_restart", "before")).written
                assert (await once.send("T_aio_stream_restart", "before")).written
                await asyncio.to_thread(small.gateway.stop)  # both streams end UNAVAILABLE
                with pytest.raises(Unavailable):
                    await once.send("T_aio_stream_restart", "while down")
                retried = [
                    asyncio.ensure_future(producer.send("T_aio_stream_restart", f"down {i}"))
                    for i in range(5)
                ]
                await asyncio.to_thread(small.restart_gateway, "--listen", listen)
                return await asyncio.gather(*retried)

        results = asyncio.run(run())
        assert all(result.written for result in results)
        assert len({result.msg_id for result in results}) == 5

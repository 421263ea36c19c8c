"""tide.client.aio's Producer and PullConsumer against a real cluster of two brokers
(mirrors tests/client/test_produce_pull.py and test_producer_batching.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop

from tests._cluster import Cluster
from tide.client import (
    InvalidArgument,
    Message,
    MessageQueue,
    NotFound,
    PullResult,
    PullStatus,
    ReceivedMessage,
    SendResult,
    TopicNotFound,
)
from tide.client import PullConsumer as SyncPullConsumer
from tide.client.aio import Admin, Producer, PullConsumer
from tide.waiting import wait_until

LONG_LINGER_MS = 60_000


def wait_dispatched(cluster: Cluster, topic: str, count: int) -> None:
    with SyncPullConsumer("G_aio_wait", cluster.gateway.listen) as consumer:
        queues = consumer.queues(topic)
        wait_until(
            lambda: sum(consumer.max_offset(q) for q in queues) >= count, f"{count} dispatched"
        )


async def pulled(consumer: PullConsumer, topic: str) -> dict[str, ReceivedMessage]:
    """Every message of the topic by its first key."""
    received = {}
    for queue in await consumer.queues(topic):
        offset = 0
        while True:
            result = await consumer.pull(queue, offset, max_messages=7)
            if result.status is PullStatus.NO_NEW_MESSAGE:
                break
            for message in result.messages:
                assert message.queue == queue
                received[message.keys[0]] = message
            offset = result.next_offset
    return received


def test_produce_and_pull_across_two_brokers(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_aio_across", queues=3)

    async def produce() -> dict[str, SendResult]:
        async with Producer(gateway) as producer:
            singles = await asyncio.gather(
                *(
                    producer.send("T_aio_across", f"body {i}", tags="TagA", keys=[f"k{i}"])
                    for i in range(30)
                )
            )
            batch = await producer.send_batch(
                [Message("T_aio_across", b"batch %d" % i, keys=[f"b{i}"]) for i in range(10)]
            )
            # The 30 concurrent sends shared calls (the accumulator's batching).
            assert producer._accumulator.calls_sent < 30
        sent = {f"k{i}": r for i, r in enumerate(singles)}
        sent.update({f"b{i}": r for i, r in enumerate(batch)})
        return sent

    sent = asyncio.run(produce())
    wait_dispatched(cluster, "T_aio_across", len(sent))

    async def consume() -> dict[str, ReceivedMessage]:
        async with PullConsumer("G_aio_across", gateway) as consumer:
            return await pulled(consumer, "T_aio_across")

    received = asyncio.run(consume())
    assert received.keys() == sent.keys()
    for key, result in sent.items():
        message = received[key]
        assert (message.queue, message.queue_offset, message.msg_id) == (
            result.queue,
            result.queue_offset,
            result.msg_id,
        )


def test_errors_are_the_sync_clients(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_aio_errors", queues=1, brokers=["broker-a"])

    async def run() -> None:
        async with Producer(gateway) as producer:
            with pytest.raises(TopicNotFound, match="T_aio_missing"):
                await producer.send("T_aio_missing", b"x")
            with pytest.raises(InvalidArgument, match="contains ' '"):
                await producer.send("bad topic", b"x")
            with pytest.raises(NotFound) as caught:
                queue = MessageQueue("T_aio_errors", "broker-a", 9)
                await producer.send("T_aio_errors", b"z", queue=queue)
            assert not isinstance(caught.value, TopicNotFound)
            # One refused message of a shared batch fails only its own send.
            good, bad = await asyncio.gather(
                producer.send("T_aio_errors", b"ok"),
                producer.send("T_aio_errors", b"no", queue=queue),
                return_exceptions=True,
            )
            assert isinstance(good, SendResult) and isinstance(bad, NotFound)
        async with PullConsumer("G_aio_errors", gateway) as consumer:
            with pytest.raises(TopicNotFound):
                await consumer.queues("T_aio_missing")
            with pytest.raises(InvalidArgument, match="max_messages"):
                await consumer.pull(MessageQueue("T_aio_errors", "broker-a", 0), 0, 0)
            with pytest.raises(InvalidArgument, match="min_messages is 40"):
                await consumer.pull(MessageQueue("T_aio_errors", "broker-a", 0), 0, min_messages=40)
        with pytest.raises(InvalidArgument, match="linger_ms"):
            Producer(gateway, linger_ms=-1)
        with pytest.raises(InvalidArgument, match="producer_group"):
            Producer(gateway, producer_group="bad group!")

    asyncio.run(run())


def test_offsets_commit_search_and_long_poll(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_aio_offsets", queues=1, brokers=["broker-b"])
    queue = MessageQueue("T_aio_offsets", "broker-b", 0)

    async def run() -> None:
        async with Producer(gateway) as producer, PullConsumer("G_aio_offsets", gateway) as c:
            results = [await producer.send("T_aio_offsets", b"m%d" % i) for i in range(3)]
            await asyncio.to_thread(wait_dispatched, cluster, "T_aio_offsets", 3)
            assert (await c.offsets(queue)).max_offset == 3
            assert await c.committed(queue) == -1
            await c.commit(queue, 2)
            assert await c.committed(queue) == 2
            at = results[1].store_timestamp_ms
            assert await c.search_offset(queue, at) <= 1
            # A long poll answered by a send made while it waits.
            poll = asyncio.create_task(c.pull(queue, 3, long_poll_timeout_ms=20_000))
            await asyncio.to_thread(cluster.gateway.wait_held, 1)
            await producer.send("T_aio_offsets", b"wake up")
            answer = await poll
            assert [m.body for m in answer.messages] == [b"wake up"]
            # A fuller pull: held for a second message that never comes, until its wait.
            started = time.monotonic()
            fuller = await c.pull(queue, 3, min_messages=2, min_messages_wait_ms=300)
            assert time.monotonic() - started >= 0.3
            assert [m.body for m in fuller.messages] == [b"wake up"]
            # Cancelling a long poll ends it at once.
            idle = asyncio.create_task(c.pull(queue, 4, long_poll_timeout_ms=20_000))
            await asyncio.to_thread(cluster.gateway.wait_held, 1)
            idle.cancel()
            with pytest.raises(asyncio.CancelledError):
                await idle

    asyncio.run(run())


def test_a_lone_message_goes_after_the_linger_and_close_flushes(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_aio_linger", queues=1, brokers=["broker-a"])

    async def run() -> None:
        producer = Producer(gateway, linger_ms=LONG_LINGER_MS)
        deliveries = [await producer.send_async("T_aio_linger", b"%d" % i) for i in range(5)]
        assert not any(d.done() for d in deliveries)  # lingering: nothing sent yet
        await producer.close()  # sends what is accumulated, without the linger
        assert [d.result().queue_offset for d in deliveries] == [0, 1, 2, 3, 4]
        await producer.close()  # idempotent
        with pytest.raises(Exception, match="closed"):
            await producer.send("T_aio_linger", b"late")

    asyncio.run(run())


def test_the_loop_ending_under_a_pull_and_an_admin(cluster: Cluster) -> None:
    """A PullConsumer and an Admin left open when their event loop ends: the long poll
    under way is cancelled with the loop (asyncio.run returns, it does not wait out the
    poll) and clients made on the next loop work."""
    gateway = cluster.gateway.listen
    topic = "T_aio_loop_end_pull"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    queue = MessageQueue(topic, "broker-a", 0)
    polls: list[asyncio.Task[PullResult]] = []

    async def left_open() -> None:
        consumer = PullConsumer("G_aio_loop_end_pull", gateway)
        admin = Admin(gateway)
        polls.append(asyncio.create_task(consumer.pull(queue, 0, long_poll_timeout_ms=30_000)))
        assert (await admin.route(topic)).queue_datas  # a call answered meanwhile

    asyncio.run(left_open())
    assert polls[0].cancelled()

    async def next_loop() -> None:
        async with Producer(gateway) as producer:
            await producer.send(topic, b"after", queue=queue)
        async with PullConsumer("G_aio_loop_end_pull", gateway) as consumer:
            result = await consumer.pull(queue, 0, long_poll_timeout_ms=5_000)
            assert [m.body for m in result.messages] == [b"after"]

    asyncio.run(next_loop())


def test_the_client_runs_on_uvloop(cluster: Cluster) -> None:
    """The same client on uvloop (the services' default loop, and a common choice of
    asyncio applications): accumulated sends, a long poll woken by a send, the pulls."""
    gateway = cluster.gateway.listen
    topic = "T_aio_uvloop"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    queue = MessageQueue(topic, "broker-a", 0)

    async def run() -> list[bytes]:
        assert type(asyncio.get_running_loop()) is uvloop.Loop
        async with Producer(gateway) as producer, PullConsumer("G_aio_uvloop", gateway) as c:
            sent = await asyncio.gather(*(producer.send(topic, b"m%d" % i) for i in range(20)))
            assert producer._accumulator.calls_sent < 20  # shared calls
            assert sorted(r.queue_offset for r in sent) == list(range(20))
            poll = asyncio.create_task(c.pull(queue, 20, long_poll_timeout_ms=20_000))
            await asyncio.to_thread(cluster.gateway.wait_held, 1)
            await producer.send(topic, b"wake up")
            assert [m.body for m in (await poll).messages] == [b"wake up"]
            result = await c.pull(queue, 0, max_messages=32)
            return [m.body for m in result.messages]

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        bodies = runner.run(run())
    assert sorted(bodies) == sorted([b"m%d" % i for i in range(20)] + [b"wake up"])

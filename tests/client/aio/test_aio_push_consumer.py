"""tide.client.aio's PushConsumer against a real cluster (mirrors
tests/client/test_push_consumer.py and test_push_consumer_retry.py): success, retry and
dead-lettering, a rebalance between two members, and a shutdown that cancels a running
handler without committing its message."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests._cluster import Cluster
from tests._metrics import scrape, total
from tide.client import (
    Admin,
    ConsumeResult,
    InvalidArgument,
    MessageQueue,
    NotFound,
    ReceivedMessage,
    TopicNotFound,
)
from tide.client import PullConsumer as SyncPullConsumer
from tide.client.aio import Producer, PushConsumer
from tide.waiting import wait_until

WAIT_S = 60.0
FAST: dict[str, Any] = {
    "heartbeat_interval_ms": 300,
    "rebalance_interval_ms": 200,
    "long_poll_timeout_ms": 1_000,
    "commit_interval_ms": 200,
    "consume_from": "first",
}


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """wait_until on a thread, the loop running meanwhile."""
    await asyncio.to_thread(wait_until, condition, what, WAIT_S)


def member(
    cluster: Cluster,
    group: str,
    topic: str,
    handler: Callable[[ReceivedMessage], Awaitable[object]],
    name: str,
    **options: Any,
) -> PushConsumer:
    return PushConsumer(
        group,
        topic,
        "*",
        handler,
        cluster.gateway.listen,
        client_id=f"{group}-{name}",
        **{**FAST, **options},
    )


def committed(cluster: Cluster, group: str, queue: MessageQueue) -> int:
    with SyncPullConsumer(group, cluster.gateway.listen) as pull:
        return pull.committed(queue)


def test_success_retry_and_dead_letter(cluster: Cluster) -> None:
    topic, group = "T_aio_push_retry", "G_aio_push_retry"
    cluster.create_topic(topic, queues=2, brokers=["broker-a"])
    with Admin(cluster.gateway.listen) as admin:
        admin.create_group(group, retry_max_times=2, retry_delays_ms=[100, 100, 100])
    seen: list[tuple[str, int]] = []

    async def handler(message: ReceivedMessage) -> ConsumeResult:
        key = message.keys[0]
        seen.append((key, message.attempt))
        if key == "poison":
            raise ValueError("cannot handle it")
        if key == "flaky" and message.attempt == 1:
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    async def run() -> None:
        async with Producer(cluster.gateway.listen) as producer:
            for key in ("ok", "flaky", "poison"):
                await producer.send(topic, key, keys=[key])
        async with member(cluster, group, topic, handler, "a") as consumer:
            await eventually(lambda: ("flaky", 2) in seen, "flaky redelivered")
            await eventually(lambda: dead_letters(cluster, group) == 1, "poison dead-lettered")
            assert consumer.retry_assignment()
        # 1 delivery + 2 retries, then the dead-letter queue.
        assert [a for k, a in seen if k == "poison"] == [1, 2, 3]
        assert [a for k, a in seen if k == "ok"] == [1]

    asyncio.run(run())


def dead_letters(cluster: Cluster, group: str) -> int:
    """Messages in the group's dead-letter queue (write-only: browsed as an operator)."""
    with Admin(cluster.gateway.listen) as admin:
        try:
            return len(admin.browse_queue(MessageQueue(f"%DLQ%{group}", "broker-a", 0), 0).messages)
        except NotFound:  # no dead letter yet: no such topic
            return 0


def test_two_members_split_the_queues_and_take_over_a_leaver(cluster: Cluster) -> None:
    topic, group = "T_aio_push_group", "G_aio_push_group"
    cluster.create_topic(topic, queues=2)  # 4 queues over the two brokers
    delivered: list[tuple[str, str]] = []

    def handler_of(name: str) -> Callable[[ReceivedMessage], Awaitable[None]]:
        async def handler(message: ReceivedMessage) -> None:
            delivered.append((name, message.keys[0]))

        return handler

    async def run() -> None:
        first = await member(cluster, group, topic, handler_of("a"), "a").start()
        second = member(cluster, group, topic, handler_of("b"), "b")
        try:
            await eventually(lambda: len(first.assignment()) == 4, "a owns every queue")
            await second.start()
            await eventually(
                lambda: len(first.assignment()) == len(second.assignment()) == 2, "2 / 2"
            )
            assert not set(first.assignment()) & set(second.assignment())
            async with Producer(cluster.gateway.listen) as producer:
                for i in range(40):  # a call each: the queues in turn
                    await producer.send(topic, b"m", keys=[f"k{i}"])
                await eventually(lambda: len(delivered) >= 40, "the first 40 consumed")
                await first.shutdown()  # commits, leaves: b takes its queues at once
                await eventually(lambda: len(second.assignment()) == 4, "b owns every queue")
                await asyncio.gather(
                    *(producer.send(topic, b"m", keys=[f"k{i}"]) for i in range(40, 60))
                )
            await eventually(lambda: len(delivered) >= 60, "every message consumed")
        finally:
            await first.shutdown()
            await second.shutdown()
        keys = [k for _, k in delivered]
        assert sorted(keys) == sorted(f"k{i}" for i in range(60)), "each message once"
        assert {name for name, _ in delivered} == {"a", "b"}
        assert all(name == "b" for name, k in delivered if int(k[1:]) >= 40)

    asyncio.run(run())


def test_shutdown_cancels_a_running_handler_and_its_message_comes_again(
    cluster: Cluster,
) -> None:
    topic, group = "T_aio_push_cancel", "G_aio_push_cancel"
    cluster.create_topic(topic, queues=1, brokers=["broker-b"])
    queue = MessageQueue(topic, "broker-b", 0)
    started: list[str] = []
    cancelled: list[str] = []

    async def stuck(message: ReceivedMessage) -> None:
        started.append(message.keys[0])
        if message.keys[0] == "stuck":
            try:
                await asyncio.Event().wait()  # never set: only cancellation ends it
            except asyncio.CancelledError:
                cancelled.append(message.keys[0])
                raise

    async def run() -> None:
        async with Producer(cluster.gateway.listen) as producer:
            for key in ("before", "stuck", "after"):
                await producer.send(topic, key, keys=[key])
        consumer = member(cluster, group, topic, stuck, "a", release_timeout_ms=200)
        async with consumer:
            await eventually(lambda: "stuck" in started, "the stuck message handled")
        assert cancelled == ["stuck"]
        assert committed(cluster, group, queue) == 1  # "before" only: "stuck" comes again
        again: list[str] = []

        async def record(message: ReceivedMessage) -> None:
            again.append(message.keys[0])

        async with member(cluster, group, topic, record, "b"):
            await eventually(lambda: len(again) >= 2, "the rest redelivered")
        assert again == ["stuck", "after"]

    asyncio.run(run())


def test_bad_options_and_an_unknown_topic(cluster: Cluster) -> None:
    def plain(message: ReceivedMessage) -> None:
        pass

    with pytest.raises(InvalidArgument, match="coroutine function"):
        PushConsumer("G_aio_bad", "T_aio_bad", "*", plain, cluster.gateway.listen)  # type: ignore[arg-type]

    async def handler(message: ReceivedMessage) -> None:
        pass

    with pytest.raises(InvalidArgument, match="max_messages"):
        PushConsumer("G_aio_bad", "T_aio_bad", "*", handler, max_messages=0)
    with pytest.raises(InvalidArgument, match="lock_interval_ms"):
        PushConsumer("G_aio_bad", "T_aio_bad", "*", handler, orderly=True, lock_interval_ms=1)

    async def run() -> None:
        consumer = PushConsumer("G_aio_bad", "T_aio_missing", "*", handler, cluster.gateway.listen)
        with pytest.raises(TopicNotFound):
            await consumer.start()
        await consumer.shutdown()  # idempotent after a failed start

    asyncio.run(run())


def test_the_loop_ending_under_a_running_consumer_commits_only_what_was_handled(
    cluster: Cluster,
) -> None:
    topic, group = "T_aio_push_loop_end", "G_aio_push_loop_end"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    queue = MessageQueue(topic, "broker-a", 0)
    handled: list[str] = []

    async def handler(message: ReceivedMessage) -> None:
        handled.append(message.keys[0])
        if message.keys[0] == "k2":
            await asyncio.Event().wait()  # never set: running when the loop ends

    async def forgets_to_shut_down() -> None:
        async with Producer(cluster.gateway.listen) as producer:
            for i in range(3):
                await producer.send(topic, b"m", keys=[f"k{i}"])
        consumer = member(cluster, group, topic, handler, "a", commit_interval_ms=600_000)
        await consumer.start()
        await eventually(lambda: len(handled) == 3, "three handled")
        # Returning here: asyncio.run cancels the consumer's tasks; the queue's task
        # commits its position as it ends: k0 and k1 handled, k2's handler cancelled.

    asyncio.run(forgets_to_shut_down())
    assert committed(cluster, group, queue) == 2  # k2 is delivered again


def held_for_min_messages(cluster: Cluster) -> float:
    return total(
        scrape(str(cluster.gateway.ready["metrics"])),
        "tide_gateway_pulls_held_for_min_messages_total",
    )


def test_fuller_pulls_reach_the_gateway(cluster: Cluster) -> None:
    """min_messages / min_messages_wait_ms: the worker's pulls are held for them (the
    gateway counts it) and every message is delivered once there are enough."""
    topic, group = "T_aio_fuller", "G_aio_fuller"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    seen: list[bytes] = []
    before = held_for_min_messages(cluster)

    async def handler(message: ReceivedMessage) -> None:
        seen.append(message.body)

    async def run() -> None:
        fuller = {"min_messages": 3, "min_messages_wait_ms": 20_000, "max_messages": 8}
        async with member(cluster, group, topic, handler, "a", **fuller):
            await eventually(
                lambda: held_for_min_messages(cluster) > before, "a pull held for 3 messages"
            )
            async with Producer(cluster.gateway.listen) as producer:
                for body in (b"f0", b"f1", b"f2"):
                    await producer.send(topic, body)
            await eventually(lambda: len(seen) == 3, "the three delivered")
        assert seen == [b"f0", b"f1", b"f2"]

    asyncio.run(run())

"""tide.client.aio's orderly PushConsumer against a real cluster (mirrors the core case
of tests/client/test_orderly_consumer.py, in one process): a FIFO topic consumed by one
member, then two, then the second alone after the first shut down. Every message
group's messages are handled in send order (a hand-over may replay from the last
commit; a failed message is retried in place before the next), none lost, and no two
members ever handle one queue at once."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass

from tests._cluster import Cluster
from tide.client import Message, Producer, ReceivedMessage
from tide.client.aio import PushConsumer
from tide.waiting import wait_until_async

GROUPS = 8
PER_GROUP = 30
FAST = {
    "heartbeat_interval_ms": 300,
    "rebalance_interval_ms": 300,
    "long_poll_timeout_ms": 1_000,
    "commit_interval_ms": 200,
    "lock_interval_ms": 300,
    "consume_from": "first",
    "retry_backoff_ms": 50,
}
FAILING = "g0/5"  # fails twice, then succeeds: retried in place
HOLD_S = 0.003  # long enough that two members on one queue would overlap


@dataclass
class Handled:
    member: str
    queue: str
    group: str
    seq: int
    start_s: float
    end_s: float


def produce(cluster: Cluster, topic: str, seqs: range) -> None:
    with Producer(cluster.gateway.listen) as producer:
        for seq in seqs:
            producer.send_batch(
                [Message(topic, f"g{g}/{seq}", sharding_key=f"g{g}") for g in range(GROUPS)]
            )


def check_order(handled: list[Handled]) -> None:
    """In start order, a group's next message is the next one, the same one (retried)
    or an earlier one (a replay after a hand-over), never one further on."""
    last: dict[str, int] = {}
    for item in sorted(handled, key=lambda h: h.start_s):
        previous = last.get(item.group, -1)
        assert item.seq <= previous + 1, f"{item.group}: {item.seq} after {previous}"
        last[item.group] = item.seq


def check_no_overlap(handled: list[Handled]) -> None:
    by_queue: dict[str, list[Handled]] = defaultdict(list)
    for item in handled:
        by_queue[item.queue].append(item)
    for items in by_queue.values():
        items.sort(key=lambda h: h.start_s)
        for before, after in itertools.pairwise(items):
            if before.member != after.member:
                assert before.end_s <= after.start_s, f"{before} overlaps {after}"


def test_orderly_members_keep_each_groups_order(cluster: Cluster) -> None:
    topic, group = "T_aio_orderly", "G_aio_orderly"
    cluster.create_topic(topic, queues=4, message_type="FIFO")
    half = PER_GROUP // 2
    produce(cluster, topic, range(half))
    handled: list[Handled] = []
    failures = {FAILING: 0}

    def handler_of(member: str):  # type: ignore[no-untyped-def]
        async def handle(message: ReceivedMessage) -> None:
            start_s = time.monotonic()
            await asyncio.sleep(HOLD_S)
            body = message.body.decode()
            queue = f"{message.queue.broker_name}:{message.queue.queue_id}"
            key, seq = body.split("/")
            handled.append(Handled(member, queue, key, int(seq), start_s, time.monotonic()))
            if body in failures and failures[body] < 2:
                failures[body] += 1
                raise RuntimeError("fails twice")

        return handle

    def seen() -> set[str]:
        return {f"{h.group}/{h.seq}" for h in handled}

    async def run() -> None:
        gateway = cluster.gateway.listen
        first = PushConsumer(group, topic, "*", handler_of("a"), gateway, orderly=True, **FAST)  # type: ignore[arg-type]
        second = PushConsumer(group, topic, "*", handler_of("b"), gateway, orderly=True, **FAST)  # type: ignore[arg-type]
        await first.start()
        await wait_until_async(lambda: len(handled) >= 40, "the first member to consume")
        await second.start()
        await wait_until_async(
            lambda: first.assignment() and second.assignment(), "both members to hold queues"
        )
        await first.shutdown()  # final commits, then unlocks: the second takes over
        await wait_until_async(lambda: len(second.assignment()) == 4, "the hand-over", 60)
        await asyncio.to_thread(produce, cluster, topic, range(half, PER_GROUP))
        await wait_until_async(lambda: len(seen()) == GROUPS * PER_GROUP, "every message", 60)
        await second.shutdown()

    asyncio.run(run())
    assert seen() == {f"g{g}/{s}" for g in range(GROUPS) for s in range(PER_GROUP)}
    assert failures[FAILING] == 2
    retried = [h for h in handled if f"{h.group}/{h.seq}" == FAILING]
    assert len(retried) >= 3  # two failures, then the success
    check_order(handled)
    check_no_overlap(handled)
    assert {h.member for h in handled} == {"a", "b"}

"""Retries in flight survive a crash of the broker: a push consumer fails every message's
first delivery (each is sent back to the group's retry topic through the schedule topic),
the broker's storage and dispatch are SIGKILLed while retries are pending, and after the
restart every message is consumed successfully, none lost. Duplicates (a message consumed
successfully more than once: at-least-once around the crash) are counted and printed.

The storage flushes synchronously, so every acknowledged send-back is on disk when the
crash comes. Duplicates come from what the crash takes back: consumer offsets committed
after the storage last persisted consumerOffset.json (every
--consumer-offsets-persist-interval-ms, as RocketMQ's flushConsumerOffsetInterval), so
the retry queue is read again from there, and a schedule level's batch re-put when the
crash came (its progress is saved after every batch).
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from tests._cluster import Cluster
from tide.client import ConsumeResult, Message, Producer, PushConsumer, ReceivedMessage
from tide.waiting import wait_until

MESSAGES = 2_000
BATCH = 100
WAIT_S = 240.0
# Retries wait level 3 + attempts: 2 s here, so many are pending when the crash comes.
LEVELS = "1s 1s 2s 2s 2s"
FAST = {
    "heartbeat_interval_ms": 300,
    "rebalance_interval_ms": 200,
    "long_poll_timeout_ms": 1_000,
    "commit_interval_ms": 200,
    "consume_from": "first",
}


class Outcomes:
    """What the application saw, per message key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failed: Counter[str] = Counter()  # first deliveries, answered RECONSUME_LATER
        self.done: Counter[str] = Counter()  # retries consumed successfully

    def callback(self, message: ReceivedMessage) -> ConsumeResult:
        key = message.keys[0]
        with self._lock:
            if message.attempt == 1:
                self.failed[key] += 1
                return ConsumeResult.RECONSUME_LATER
            self.done[key] += 1
            return ConsumeResult.SUCCESS

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return len(self.failed), len(self.done)


def test_retries_in_flight_survive_a_broker_sigkill(tmp_path: Path) -> None:
    with Cluster(
        tmp_path,
        brokers=1,
        storage_args=("--flush", "sync"),
        dispatch_args=("--message-delay-level", LEVELS),
    ) as cluster:
        topic, group = "T_retry_crash", "G_retry_crash"
        cluster.create_topic(topic, queues=2)
        keys = [f"k{i}" for i in range(MESSAGES)]
        with Producer(cluster.gateway.listen) as producer:
            for start in range(0, MESSAGES, BATCH):
                producer.send_batch(
                    [Message(topic, b"m", keys=[key]) for key in keys[start : start + BATCH]]
                )
        outcomes = Outcomes()
        with PushConsumer(
            group,
            topic,
            "*",
            outcomes.callback,
            cluster.gateway.listen,
            **FAST,  # type: ignore[arg-type]
        ):
            wait_until(
                lambda: outcomes.counts()[0] >= MESSAGES // 2,
                "half of the messages failed once and sent back",
                WAIT_S,
            )
            member = cluster.brokers[0].master
            member.kill()
            failed_at_kill, done_at_kill = outcomes.counts()
            cluster.restart(member)
            wait_until(
                lambda: outcomes.counts()[1] == MESSAGES,
                "every message consumed successfully after the restart",
                WAIT_S,
            )
        assert set(outcomes.done) == set(keys)
        assert set(outcomes.failed) == set(keys)
        duplicates = sum(outcomes.done.values()) - MESSAGES
        refailed = sum(outcomes.failed.values()) - MESSAGES
        print(
            f"killed with {failed_at_kill} sent back and {done_at_kill} retried; after the "
            f"restart: {duplicates} duplicate successes, {refailed} first deliveries repeated"
        )

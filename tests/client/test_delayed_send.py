"""Delayed sends through the client against a real cluster (the dispatches' default delay
level table: level 1 is 1 s). "No earlier than due" compares store timestamps."""

from __future__ import annotations

import time

from tests._cluster import Cluster
from tide.client import Admin, Message, Producer, ReceivedMessage
from tide.format import (
    DEFAULT_TIMER_PRECISION_MS,
    SCHEDULE_TOPIC,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
    TIMER_TOPIC,
)
from tide.waiting import wait_until

LOAD_SLACK_MS = 10_000


def delivered(admin: Admin, topic: str, unique_key: str) -> list[ReceivedMessage]:
    return admin.query_unique_key(topic, unique_key)


def test_send_sync_batch_and_async_with_a_delay_level(cluster: Cluster) -> None:
    topic = "T_client_delayed"
    gateway = cluster.gateway.listen
    with (
        Admin(gateway) as admin,
        Producer(gateway, stream=True) as streamed,
        Producer(gateway) as producer,
    ):
        admin.create_topic(topic, read_queue_nums=2, message_type="DELAY")
        results = [
            producer.send(topic, "sync", delay_level=1, properties={"n": "0"}),
            *producer.send_batch([Message(topic, "batch", delay_level=1)]),
            producer.send_async(topic, "async", delay_level=1).result(timeout=60),
            streamed.send_async(topic, "stream", delay_level=1).result(timeout=60),
        ]
        for result in results:
            stored = admin.query_id(result.msg_id)
            assert (stored.topic, stored.properties["DELAY"]) == (SCHEDULE_TOPIC, "1")
            wait_until(
                lambda result=result: delivered(admin, topic, result.unique_key),  # type: ignore[misc]
                f"the copy of {result.unique_key}",
            )
            (copy,) = delivered(admin, topic, result.unique_key)
            assert copy.store_timestamp_ms >= stored.store_timestamp_ms + 1000
            assert copy.queue == result.queue
        assert delivered(admin, topic, results[0].unique_key)[0].properties["n"] == "0"


def test_send_at_a_past_time_is_delivered_now(cluster: Cluster) -> None:
    topic = "T_client_past"
    with Admin(cluster.gateway.listen) as admin, Producer(cluster.gateway.listen) as producer:
        admin.create_topic(topic, read_queue_nums=1, message_type="DELAY")
        result = producer.send(topic, "now", deliver_at_ms=1)
        assert admin.query_id(result.msg_id).topic == topic


def test_timed_sends_arrive_when_due_and_can_be_recalled(cluster: Cluster) -> None:
    """The whole path of a timed message: the gateway's rewrite into the timer topic, the
    dispatch's timer, the copy in the real topic no earlier than its time (store clocks)
    and within the precision (the dispatch's default) plus load slack; a recalled one never
    arrives."""
    topic = "T_client_timed"
    gateway = cluster.gateway.listen
    with Admin(gateway) as admin, Producer(gateway) as producer:
        admin.create_topic(topic, read_queue_nums=2, message_type="DELAY")
        at_ms = time.time_ns() // 1_000_000 + 2_000
        sent = [
            producer.send(topic, "at", deliver_at_ms=at_ms, keys=["timed-at"]),
            producer.send(topic, "in", delay_ms=1_500, keys=["timed-in"]),
        ]
        recalled = producer.send(topic, "recalled", deliver_at_ms=at_ms, keys=["timed-gone"])
        assert admin.query_id(recalled.msg_id).topic == TIMER_TOPIC
        assert admin.recall(recalled.msg_id).unique_key == recalled.unique_key
        for result in sent:
            stored = admin.query_id(result.msg_id)
            assert stored.topic == TIMER_TOPIC
            due_ms = int(stored.properties[TIMER_DELIVER_MS])  # the asked time
            wait_until(
                lambda result=result: delivered(admin, topic, result.unique_key),  # type: ignore[misc]
                f"the copy of {result.unique_key}",
            )
            (copy,) = delivered(admin, topic, result.unique_key)
            assert copy.store_timestamp_ms >= due_ms
            # One precision period, plus slack for a loaded 2-core box (the benchmark
            # measures lateness: docs/benchmarks.md).
            assert copy.store_timestamp_ms < due_ms + DEFAULT_TIMER_PRECISION_MS + LOAD_SLACK_MS
            assert copy.queue == result.queue and copy.body == stored.body
            assert TIMER_OUT_MS not in copy.properties and "REAL_TOPIC" not in copy.properties
        wait_until(
            lambda: (
                cluster.broker("broker-a").dispatch.status().delivery.timer_delivered_to_ms
                > at_ms + 1_000
                and cluster.broker("broker-b").dispatch.status().delivery.timer_delivered_to_ms
                > at_ms + 1_000
            ),
            "every broker's timer past the recalled message's slot",
        )
        assert admin.query_key(topic, "timed-gone") == []

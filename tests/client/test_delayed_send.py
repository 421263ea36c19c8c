"""Delayed sends through the client against a real cluster (the dispatches' default delay
level table: level 1 is 1 s). "No earlier than due" compares store timestamps."""

from __future__ import annotations

from tests._cluster import Cluster
from tide.client import Admin, Message, Producer, ReceivedMessage
from tide.format import SCHEDULE_TOPIC
from tide.waiting import wait_until


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

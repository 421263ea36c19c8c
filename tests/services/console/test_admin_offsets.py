"""tide.client's Admin calls added for the console (tide/client/_admin_offsets.py):
queues and offsets, search by time, a group's committed offset, commit, lag and members.
Here to share the console package's cluster."""

from __future__ import annotations

import time

import pytest

from tests._cluster import Cluster
from tide.client import Admin, InvalidArgument, MessageQueue, Producer, PushConsumer
from tide.waiting import wait_until

TOPIC = "T_console_admin"
GROUP = "G_console_admin"


def test_offsets_search_commit_and_lag(console_cluster: Cluster) -> None:
    gateway = console_cluster.gateway.listen
    console_cluster.create_topic(TOPIC, queues=2)
    queue = MessageQueue(TOPIC, "broker-a", 0)
    with Producer(gateway) as producer:
        first = producer.send(TOPIC, b"a", queue=queue)
        producer.send(TOPIC, b"b", queue=queue)
    console_cluster.wait_dispatched(TOPIC, 2)
    with Admin(gateway) as admin:
        assert admin.queues(TOPIC) == [queue, MessageQueue(TOPIC, "broker-a", 1)]
        offsets = admin.offsets(queue)
        assert (offsets.min_offset, offsets.max_offset) == (0, 2)
        assert admin.search_offset(queue, 0) == 0
        assert admin.search_offset(queue, first.store_timestamp_ms + 3_600_000) == 2
        assert admin.committed(GROUP, queue) == -1
        admin.commit_offset(GROUP, queue, 1)
        assert admin.committed(GROUP, queue) == 1
        lag = admin.group_lag(GROUP, TOPIC)
        assert lag.ready == 1
        assert {(q.queue_id, q.consumer_offset) for q in lag.queues} >= {(0, 1)}
        with pytest.raises(InvalidArgument, match="timestamp_ms"):
            admin.search_offset(queue, -1)


def test_members_carry_their_subscriptions(console_cluster: Cluster) -> None:
    gateway = console_cluster.gateway.listen
    console_cluster.create_topic(TOPIC + "_m", queues=1)
    with (
        PushConsumer(
            GROUP + "_m", TOPIC + "_m", "TagA", lambda m: None, gateway, heartbeat_interval_ms=500
        ),
        Admin(gateway) as admin,
    ):
        wait_until(lambda: bool(admin.members(GROUP + "_m")), "the member's heartbeat")
        member = admin.members(GROUP + "_m")[0]
        topics = {(s.topic, s.expression) for s in member.subscriptions}
        assert (TOPIC + "_m", "TagA") in topics
        assert member.last_heartbeat_ms <= time.time() * 1000 + 60_000

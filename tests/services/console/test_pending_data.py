"""The pending page's data against a real one-broker cluster: delay-level and timed
messages not yet due (a recalled one left out) and unresolved half messages."""

from __future__ import annotations

import time

import pytest

from services.console.data.pending import pending
from tests._cluster import Cluster
from tide.client import Admin, Message, Producer, TransactionResolution
from tide.waiting import wait_until


@pytest.fixture(scope="module")
def cluster(console_cluster: Cluster) -> Cluster:
    """The console tests' one cluster (tests/services/console/conftest.py)."""
    return console_cluster


WAIT_S = 30.0
HOUR_MS = 3_600_000


def test_delayed_timed_and_half_messages(cluster: Cluster) -> None:
    topic, other = "T_console_pending", "T_console_pending_other"
    cluster.create_topic(topic, queues=1, message_type="MIXED")
    cluster.create_topic(other, queues=1, message_type="DELAY")
    now = int(time.time() * 1000)
    with Producer(cluster.gateway.listen, producer_group="PG_console_pending") as producer:
        level = producer.send_batch([Message(topic, "in 2 hours", delay_level=18, keys=["lvl"])])[0]
        timed = producer.send_batch([Message(topic, "at +1h", deliver_at_ms=now + HOUR_MS)])[0]
        recalled = producer.send_batch([Message(topic, "recalled", delay_ms=HOUR_MS)])[0]
        producer.send_batch([Message(other, "elsewhere", delay_ms=HOUR_MS)])
        half = producer.send_transaction(
            Message(topic, "undecided"), lambda message, sent: TransactionResolution.UNKNOWN
        )
    with Admin(cluster.gateway.listen) as admin:
        admin.recall(recalled.msg_id)

        def listed() -> bool:
            found = pending(admin, topic)
            return len(found.delayed) == 2 and len(found.halves) == 1

        wait_until(listed, "two delayed messages and a half message", WAIT_S)
        found = pending(admin, topic)
        by_kind = {d.kind: d for d in found.delayed}
        assert set(by_kind) == {"level 18", "timer"}
        assert by_kind["level 18"].message.msg_id == level.msg_id
        assert by_kind["level 18"].real_topic == topic
        assert by_kind["level 18"].due_ms == level.store_timestamp_ms + 2 * HOUR_MS
        assert by_kind["timer"].message.msg_id == timed.msg_id
        assert by_kind["timer"].due_ms == now + HOUR_MS
        assert [d.due_ms for d in found.delayed] == sorted(d.due_ms for d in found.delayed)
        assert not found.delayed_truncated
        counts = dict(found.counts)  # every topic's: the other tests' too
        assert counts["level 18"] >= 1 and counts["timer"] >= 2  # the recalled one is not
        (pending_half,) = found.halves
        assert pending_half.msg_id == half.half.msg_id
        assert pending_half.producer_group == "PG_console_pending"
        assert pending_half.topic == topic
        assert {d.real_topic for d in pending(admin).delayed} >= {topic, other}
        # Two hours on, none of them is due any more (as the page would see it then).
        assert pending(admin, topic, now_ms=now + 3 * HOUR_MS).delayed == ()


def test_a_scan_stopped_by_its_limit_says_so(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = "T_console_pending_many"
    cluster.create_topic(topic, queues=1, message_type="DELAY")
    with Producer(cluster.gateway.listen) as producer:
        for i in range(3):
            producer.send_batch([Message(topic, f"later-{i}", delay_level=16)])
    monkeypatch.setattr("services.console.data.pending.PENDING_MAX_SCANNED", 2)
    with Admin(cluster.gateway.listen) as admin:
        found = pending(admin, topic)
    assert len(found.delayed) == 2
    assert "only 2 messages of SCHEDULE_TOPIC_XXXX@broker-a:15 were read" in found.delayed_truncated

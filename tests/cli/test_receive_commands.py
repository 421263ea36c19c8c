"""``tide receive`` and ``tide group lag`` through the real entry point against a real
cluster: messages received, printed and acked (the group's lag drops to zero), and
``--no-ack`` leaving them in flight."""

from __future__ import annotations

import json

from tests._cluster import Cluster, cluster_fixture
from tests.cli.test_gateway_commands import json_lines, ok, tide
from tide.client import Producer

cluster = cluster_fixture(brokers=1)


def _lag(cluster: Cluster, group: str, topic: str) -> dict[str, object]:
    document: dict[str, object] = json.loads(
        ok(tide(cluster, "group", "lag", group, topic, "--json"))
    )
    return document


def test_receive_prints_and_acks(cluster: Cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = "T_cli_receive"
    cluster.create_topic(topic, queues=2)
    with Producer(cluster.gateway.listen) as producer:
        sent = [producer.send(topic, f"m{i}", keys=[f"k{i}"]) for i in range(6)]
    assert _lag(cluster, "G_cli_receive", topic)["ready"] == 6
    out = tmp_path / "out.jsonl"
    ok(tide(cluster, "receive", "G_cli_receive", topic, "--count", "6", "--output", out))
    printed = json_lines(out.read_text())
    assert sorted(m["msg_id"] for m in printed) == sorted(s.msg_id for s in sent)
    lag = _lag(cluster, "G_cli_receive", topic)
    assert (lag["ready"], lag["inflight"]) == (0, 0)
    table = ok(tide(cluster, "group", "lag", "G_cli_receive", topic))
    assert table.splitlines()[0].split() == [
        "BROKER",
        "QUEUE",
        "MAX",
        "GROUP",
        "OFFSET",
        "READY",
        "INFLIGHT",
    ]


def test_receive_no_ack_leaves_messages_in_flight(cluster: Cluster) -> None:
    topic = "T_cli_receive_no_ack"
    cluster.create_topic(topic, queues=1)
    with Producer(cluster.gateway.listen) as producer:
        producer.send(topic, "x")
    out = ok(tide(cluster, "receive", "G_cli_no_ack", topic, "--count", "1", "--no-ack"))
    assert "x" in out
    lag = _lag(cluster, "G_cli_no_ack", topic)
    assert (lag["ready"], lag["inflight"]) == (0, 1)


def test_group_create_consume_orderly(cluster: Cluster) -> None:
    shown = json.loads(
        ok(tide(cluster, "group", "create", "G_cli_fifo", "--consume-orderly", "--json"))
    )
    assert shown["group"]["consume_message_orderly"] is True

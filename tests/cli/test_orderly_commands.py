"""FIFO through the real ``tide`` entry point against a real cluster: ``tide produce
--sharding-key`` (the message group) to a FIFO topic and its refusal without one,
``tide consume --orderly`` (each group in send order), ``tide group locks``."""

from __future__ import annotations

import json

from tests._cluster import Cluster, cluster_fixture
from tests.cli.test_gateway_commands import json_lines, ok, tide
from tide.client import PushConsumer, ReceivedMessage
from tide.waiting import wait_until

# Short leases: a started storage grants no lock for one lease.
cluster = cluster_fixture(brokers=1, storage_args=("--rebalance-lock-max-live-time-ms", "2000"))
COUNT = 30
KEYS = 3


def test_fifo_produce_consume_orderly_and_locks(cluster: Cluster) -> None:
    topic = "T_cli_fifo"
    ok(tide(cluster, "topic", "create", topic, "--queues", "2", "--message-type", "FIFO"))
    refused = tide(cluster, "produce", topic, "--body", "x")
    assert refused.returncode != 0
    assert "no message group" in refused.stderr and "--sharding-key" in refused.stderr
    for i in range(COUNT):  # one by one: send order is the order of the calls
        ok(
            tide(
                cluster,
                "produce",
                topic,
                "--body",
                f"k{i % KEYS}/{i}",
                "--sharding-key",
                f"k{i % KEYS}",
            )
        )
    out = ok(
        tide(
            cluster,
            "consume",
            "g_cli_fifo",
            topic,
            "--orderly",
            "--from",
            "first",
            "--count",
            str(COUNT),
            "--json",
        )
    )
    seen: dict[str, list[int]] = {}
    for line in json_lines(out):
        key, index = line["body_utf8"].split("/")
        assert line["properties"]["__SHARDINGKEY"] == key
        seen.setdefault(key, []).append(int(index))
    assert seen == {f"k{k}": list(range(k, COUNT, KEYS)) for k in range(KEYS)}

    def nothing(message: ReceivedMessage) -> None:
        pass

    with PushConsumer(
        "g_cli_locks",
        topic,
        "*",
        nothing,
        cluster.gateway.listen,
        orderly=True,
        rebalance_interval_ms=200,
    ) as member:
        wait_until(lambda: len(member.assignment()) == 2, "both queues locked", 60)
        shown = json.loads(ok(tide(cluster, "group", "locks", "g_cli_locks", topic, "--json")))
        assert [(lock["queue_id"], lock["client_id"]) for lock in shown["locks"]] == [
            (0, member.client_id),
            (1, member.client_id),
        ]
        table = ok(tide(cluster, "group", "locks", "g_cli_locks", topic))
        assert member.client_id in table and "EXPIRES IN MS" in table
    # Shut down: its queues were unlocked after its final commits.
    shown = json.loads(ok(tide(cluster, "group", "locks", "g_cli_locks", topic, "--json")))
    assert shown["locks"] == []

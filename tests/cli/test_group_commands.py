"""``tide group create|update|show|list|delete`` through the real entry point against a
real cluster."""

from __future__ import annotations

import json

from tests._cluster import Cluster, cluster_fixture
from tests.cli.test_gateway_commands import ok, tide
from tide.client import Admin

cluster = cluster_fixture(brokers=1)


def test_group_commands(cluster) -> None:  # type: ignore[no-untyped-def]
    created = ok(
        tide(
            cluster,
            "group",
            "create",
            "g_cli",
            "--retry-max-times",
            "3",
            "--retry-delays",
            "1s,30s,2m",
        )
    )
    assert created.splitlines()[0] == "created group g_cli on broker-a"
    assert "customized 1s,30s,2m" in created
    with Admin(cluster.gateway.listen) as admin:
        group = admin.get_group("g_cli").group
    assert group.retry_max_times == 3
    assert list(group.retry_policy.delays_ms) == [1000, 30_000, 120_000]

    ok(
        tide(
            cluster,
            "group",
            "update",
            "g_cli",
            "--retry-policy",
            "exponential",
            "--retry-initial",
            "2s",
            "--retry-max",
            "1h",
            "--retry-multiplier",
            "3",
            "--no-consume-enable",
        )
    )
    shown = json.loads(ok(tide(cluster, "group", "show", "g_cli", "--json")))
    assert shown["found"]
    assert shown["group"]["retry_max_times"] == 3  # kept by the update
    assert shown["group"]["consume_enable"] is False
    assert shown["group"]["retry_policy"] == {
        "type": "exponential",
        "initial_ms": 2000,
        "max_ms": 3_600_000,
        "multiplier": 3,
    }
    table = ok(tide(cluster, "group", "show", "g_cli"))
    assert "exponential 2s x3 up to 1h" in table

    listing = ok(tide(cluster, "group", "list")).splitlines()
    assert listing[0].split() == ["GROUP", "CONSUME", "RETRY", "MAX", "POLICY", "RETRY", "QUEUES"]
    assert any(line.split()[:3] == ["g_cli", "off", "3"] for line in listing[1:])

    defaults = ok(tide(cluster, "group", "show", "g_cli_nobody"))
    assert defaults.startswith("group g_cli_nobody has no config: the defaults")

    assert ok(tide(cluster, "group", "delete", "g_cli")) == "deleted the config of group g_cli\n"
    gone = tide(cluster, "group", "delete", "g_cli")
    assert gone.returncode == 1 and "had no config" in gone.stdout


def test_group_bad_input(cluster: Cluster) -> None:
    bad_delay = tide(cluster, "group", "create", "g_cli_bad", "--retry-delays", "10s,soon")
    assert bad_delay.returncode == 2 and "'soon' is not a duration" in bad_delay.stderr
    too_many = tide(cluster, "group", "create", "g_cli_bad", "--retry-max-times", "5000")
    assert too_many.returncode == 1
    assert "retry_max_times is 5000; it must be 0..1000" in too_many.stderr
    mixed = tide(
        cluster, "group", "create", "g_cli_bad", "--retry-delays", "1s", "--retry-max", "1h"
    )
    assert mixed.returncode == 1 and "for an exponential policy" in mixed.stderr
    with Admin(cluster.gateway.listen) as admin:
        assert not admin.get_group("g_cli_bad").found

"""examples/rocketmq5_client.py (docs/rocketmq5.md) runs as written against a cluster,
with the official client in .venv-rmq5: sends three messages, receives and acks them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.v2.rmq5 import CLIENT_TIMEOUT_S, ROOT, client_env, client_python

cluster = cluster_fixture(brokers=1)
EXAMPLE = ROOT / "examples" / "rocketmq5_client.py"


def test_the_example_sends_receives_and_acks(cluster: Cluster, tmp_path: Path) -> None:
    cluster.create_topic("Orders", queues=2, message_type="NORMAL")
    done = subprocess.run(
        [str(client_python()), str(EXAMPLE), cluster.gateway.listen, "Orders", "OrdersApp"],
        env=client_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert sum(line.startswith("sent ") for line in lines) == 3
    assert sum(line.startswith("received ") for line in lines) == 3
    assert "region" in done.stdout and "all received and acked" in done.stdout

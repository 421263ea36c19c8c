"""Replication metrics and the replica wait span: a SYNC_MASTER and one slave."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._cluster import Cluster
from tests._metrics import SCRAPE_INTERVAL_S, scrape, total
from tests.observability._support import read_spans, telemetry_cluster
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until

TOPIC = "T_obs_replicated"


@pytest.fixture(scope="module")
def spans_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spans")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, spans_dir: Path) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("replicated")
    with telemetry_cluster(
        root, spans_dir, brokers=1, replicas=2, master_role="SYNC_MASTER"
    ) as started:
        started.create_topic(TOPIC, queues=1)
        yield started


def test_replication_lag_is_reported_by_master_and_slave(cluster: Cluster, spans_dir: Path) -> None:
    broker = cluster.brokers[0]
    master = broker.master.storage.ready["metrics"]
    slave = broker.slaves[0].storage.ready["metrics"]

    def slave_connected() -> bool:
        return total(scrape(master), "tide_storage_replication_slaves") == 1

    wait_until(
        slave_connected,
        "the master to count its slave",
        state=lambda: scrape(master),
        interval_s=SCRAPE_INTERVAL_S,
    )
    reply: pb.ProduceResponse = cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=[pb.ProduceMessage(topic=TOPIC, body=b"r" * 64)] * 5),
        timeout=20,
    )
    assert all(r.status == pb.ProduceResult.SEND_OK for r in reply.results), reply

    def lag_families() -> bool:
        on_master = scrape(master)
        on_slave = scrape(slave)
        return (
            any(k.startswith("tide_storage_replication_lag_bytes{") for k in on_master)
            and 'slave_id="1"' in " ".join(on_master)
            and total(on_slave, "tide_storage_replication_lag_bytes", role="slave") == 0
            and any(
                k.startswith("tide_storage_replication_lag_seconds{") and 'role="slave"' in k
                for k in on_slave
            )
            and total(on_slave, "tide_storage_commitlog_max_offset_bytes")
            == total(on_master, "tide_storage_commitlog_max_offset_bytes")
            > 0
        )

    wait_until(
        lag_families,
        "replication gauges on master and slave (caught up)",
        interval_s=SCRAPE_INTERVAL_S,
    )

    def replica_wait_span() -> bool:
        spans = read_spans(spans_dir)
        appends = {s["span_id"] for s in spans if s["name"] == "tide.v1.Storage/Append"}
        return any(
            s["name"] == "storage.replica_wait" and s["parent_span_id"] in appends for s in spans
        )

    wait_until(
        replica_wait_span,
        "a storage.replica_wait span under an Append span",
        interval_s=SCRAPE_INTERVAL_S,
    )

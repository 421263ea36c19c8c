"""TLS on a real cluster (docs/security.md): every service started with --tls-*, certificates
made here with ``cryptography`` (tide.certs).

* tide.client and the CLI reach the gateway over TLS (the gateway wants no client cert);
* a slave replicates from its master over mutual TLS (the internal links);
* plaintext clients are refused everywhere; storage, dispatch and the name server refuse
  a client without a certificate and one whose certificate another CA signed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests._cluster import Cluster
from tests._service_process import REPO_ROOT, child_env
from tests.services.gateway.v2.rmq5 import of, run_client
from tide.certs import LeafFiles, make_ca, make_leaf
from tide.client import Producer, SimpleConsumer, TlsFiles
from tide.tls import channel_credentials
from tide.v1 import storage_pb2 as spb
from tide.waiting import wait_until

TIMEOUT_S = 60.0
HEALTH_TIMEOUT_S = 10.0


def tls_files(leaf: LeafFiles) -> TlsFiles:
    return TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(leaf.ca_file))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsFiles]:
    root = tmp_path_factory.mktemp("certs")
    cluster_ca = make_ca(root / "cluster", "cluster-ca")
    other_ca = make_ca(root / "other", "other-ca")
    return {
        "cluster": tls_files(make_leaf(cluster_ca, root / "cluster", "service")),
        "other": tls_files(make_leaf(other_ca, root / "other", "intruder")),
    }


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, TlsFiles]
) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("tls-cluster")
    with Cluster(root, brokers=1, replicas=2, tls=certs["cluster"]) as started:
        yield started


def health_status(target: str, credentials: grpc.ChannelCredentials | None) -> int:
    """The health check's status over a fresh channel (raises grpc.RpcError if refused)."""
    if credentials is None:
        channel = grpc.insecure_channel(target)
    else:
        channel = grpc.secure_channel(target, credentials)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=HEALTH_TIMEOUT_S)
        return int(reply.status)


def refused(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failed:
        health_status(target, credentials)
    code: grpc.StatusCode = failed.value.code()
    return code


def internal_targets(cluster: Cluster) -> dict[str, str]:
    broker = cluster.brokers[0]
    return {
        "name server": cluster.nameservers[0].listen,
        "storage": broker.master.storage.listen,
        "dispatch": broker.master.dispatch.listen,
        "slave storage": broker.slaves[0].storage.listen,
    }


def test_client_produces_and_receives_over_tls(
    cluster: Cluster, certs: dict[str, TlsFiles]
) -> None:
    cluster.create_topic("T_tls_client", queues=2)
    gateway_ca = TlsFiles(ca_file=certs["cluster"].ca_file)  # no client certificate
    with Producer(cluster.gateway.listen, tls=gateway_ca) as producer:
        sent = {producer.send("T_tls_client", f"secret {n}").msg_id for n in range(5)}
    received: set[str] = set()
    with SimpleConsumer(
        "G_tls", "T_tls_client", gateway=cluster.gateway.listen, tls=gateway_ca
    ) as consumer:

        def all_received() -> bool:
            batch = consumer.receive(16)
            received.update(message.message.msg_id for message in batch)
            if batch:
                consumer.ack_many(batch)
            return received >= sent

        wait_until(all_received, "every message received over TLS")


def test_slave_replicates_over_mutual_tls(cluster: Cluster) -> None:
    cluster.create_topic("T_tls_replica", queues=1)
    with Producer(
        cluster.gateway.listen, tls=TlsFiles(ca_file=cluster.tls.ca_file if cluster.tls else None)
    ) as producer:
        producer.send("T_tls_replica", b"x" * 1000)
    broker = cluster.brokers[0]
    master = broker.master.storage.stub.GetStatus(spb.GetStatusRequest()).max_offset

    def replicated() -> bool:
        status = broker.slaves[0].storage.stub.GetStatus(spb.GetStatusRequest())
        return bool(status.max_offset >= master)

    wait_until(replicated, f"the slave at the master's offset {master}")


def test_plaintext_clients_are_refused(cluster: Cluster) -> None:
    for name, target in {"gateway": cluster.gateway.listen, **internal_targets(cluster)}.items():
        assert refused(target, None) == grpc.StatusCode.UNAVAILABLE, name


def test_internal_links_need_a_certificate_the_cluster_ca_signed(
    cluster: Cluster, certs: dict[str, TlsFiles]
) -> None:
    ca_only = channel_credentials(TlsFiles(ca_file=certs["cluster"].ca_file))
    other = certs["other"]
    foreign = channel_credentials(
        TlsFiles(other.cert_file, other.key_file, certs["cluster"].ca_file)
    )
    ours = channel_credentials(certs["cluster"])
    for name, target in internal_targets(cluster).items():
        assert refused(target, ca_only) == grpc.StatusCode.UNAVAILABLE, name
        assert refused(target, foreign) == grpc.StatusCode.UNAVAILABLE, name
        assert health_status(target, ours) == health_pb2.HealthCheckResponse.SERVING, name
    # The public port takes a client with no certificate (it authenticates by signature).
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health_status(cluster.gateway.listen, ca_only) == serving


def tide_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tide.cli", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_cli_over_tls_by_flag_and_by_env(cluster: Cluster, certs: dict[str, TlsFiles]) -> None:
    ca_file = str(certs["cluster"].ca_file)
    gateway = cluster.gateway.listen
    env = child_env()
    made = tide_cli(
        "topic", "create", "T_tls_cli", "--gateway", gateway, "--tls-ca-file", ca_file, env=env
    )
    assert made.returncode == 0, made.stdout + made.stderr
    by_env = {**env, "TIDE_GATEWAY": gateway, "TIDE_TLS_CA_FILE": ca_file}
    sent = tide_cli("produce", "T_tls_cli", "--count", "3", env=by_env)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    plain = tide_cli("produce", "T_tls_cli", "--count", "1", "--gateway", gateway, env=env)
    assert plain.returncode != 0
    assert "unavailable" in plain.stderr.lower(), plain.stderr


BENCH_WORKLOAD = """\
description: TLS smoke run
topics: 1
queues_per_topic: 1
message_size: 64
batch_size: 5
producers_per_topic: 2
producer_processes: 2
inflight: 2
consumers_per_topic: 1
rate: 100
warmup_s: 0.2
duration_s: 1
"""


def test_bench_over_tls(cluster: Cluster, certs: dict[str, TlsFiles], tmp_path: Path) -> None:
    workload = tmp_path / "tls.yaml"
    workload.write_text(BENCH_WORKLOAD)
    ca_file = str(certs["cluster"].ca_file)
    gateway = cluster.gateway.listen
    result = tide_cli(
        "bench", "run", str(workload), "--gateway", gateway, "--tls-ca-file", ca_file, "--json",
        env=child_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["totals"]["published"] > 0, report["totals"]
    assert report["totals"]["published"] == report["totals"]["consumed"], report["totals"]
    assert report["errors"] == 0, report["last_error"]


def test_official_rocketmq5_client_over_tls(
    cluster: Cluster, certs: dict[str, TlsFiles], tmp_path: Path
) -> None:
    """The official client's tls_enable=True verifies the gateway against gRPC's default
    roots; GRPC_DEFAULT_SSL_ROOTS_FILE_PATH points them at the cluster CA. Without it the
    handshake fails (the client does verify)."""
    topic = "T_tls_rmq5"
    cluster.create_topic(topic, queues=2, message_type="NORMAL")
    gateway = cluster.gateway.listen
    trust = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(certs["cluster"].ca_file)}
    home = tmp_path / "home"
    sent = of(
        run_client(home, "produce", gateway, topic, "--count", "3", "--tls", env=trust), "sent"
    )
    assert len(sent) == 3
    received = of(
        run_client(
            home, "simple", gateway, topic, "G_tls_rmq5", "--count", "3", "--tls", env=trust
        ),
        "received",
    )
    assert {event["message_id"] for event in received} >= {event["message_id"] for event in sent}
    untrusted = run_client(home, "produce", gateway, topic, "--tls", check=False)
    assert not of(untrusted, "sent"), untrusted

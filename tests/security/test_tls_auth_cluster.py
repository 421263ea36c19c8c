"""TLS and authentication together on one real cluster (docs/security.md): every service
on TLS (mutual TLS between them) with the cluster secret, the gateway with
--auth-enabled. Every client of ours connects with TLS + credentials (tide.client's
Admin, Producer, SimpleConsumer, PullConsumer, PushConsumer; the CLI; tide bench; the
official RocketMQ 5 client); plaintext, unsigned and certificate-less clients are
refused; a flood of denied calls logs a bounded number of audit events; and after all of
it no secret appears in any log file, span file, metrics page or error message (the
last test of the module)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests._cluster import Cluster
from tests._service_process import REPO_ROOT
from tests.auth.conftest import ADMIN, init_user_file
from tests.cli.test_bench import tiny_workload
from tests.services.gateway.v2.rmq5 import of, run_client
from tide.auth.client import signed_channel
from tide.certs import make_ca, make_leaf
from tide.client import (
    Admin,
    Credentials,
    PermissionDenied,
    PolicyEntry,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
    SimpleConsumer,
    TideError,
    TlsFiles,
    Unauthenticated,
)
from tide.tls import channel_credentials
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.v1.storage_pb2 import GetStatusRequest
from tide.v1.storage_pb2_grpc import StorageStub
from tide.waiting import wait_until

pytestmark = pytest.mark.timeout(600)

CLUSTER_SECRET = "tls-and-auth-cluster-secret-0123"
CAROL = Credentials("carol", "carols-secret-key-0123456789")
TOPIC = "secure-orders"
GROUP = "g-carol"
FLOOD = 40
TIMEOUT_S = 120.0


class Secure:
    def __init__(self, cluster: Cluster, root: Path, ca_file: str) -> None:
        self.cluster = cluster
        self.root = root
        self.trust = TlsFiles(ca_file=ca_file)  # clients verify the gateway; no cert
        self.errors: list[str] = []  # every error message a client saw

    @property
    def gateway(self) -> str:
        return self.cluster.gateway.listen

    def admin(self) -> Admin:
        return Admin(self.gateway, tls=self.trust, credentials=ADMIN)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    root = tmp_path_factory.mktemp("tls-auth")
    authority = make_ca(root / "certs")
    leaf = make_leaf(authority, root / "certs", "service")
    files = TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(leaf.ca_file))
    secret_file = root / "cluster.secret"
    secret_file.write_text(CLUSTER_SECRET)
    secret = ("--cluster-secret-file", str(secret_file))
    traced = ("--otel-traces-exporter", "file")
    spans = ("--otel-traces-file", str(root / "spans-{service}-{pid}.jsonl"))
    with Cluster(
        root / "cluster",
        brokers=1,
        tls=files,
        nameserver_args=secret,
        dispatch_args=secret,
        storage_args=[*secret, "--auth-init-user-file", str(init_user_file(root)), *traced, *spans],
        gateway_args=[
            *secret, "--auth-enabled", "--auth-refresh-interval-ms", "200", *traced, *spans,
        ],
    ) as cluster:  # fmt: skip
        secure = Secure(cluster, root, str(leaf.ca_file))
        _grant_carol(secure)
        yield secure


def _grant_carol(secure: Secure) -> None:
    def admin_ready() -> bool:
        try:
            with secure.admin() as admin:
                admin.list_users()
        except TideError:
            return False
        return True

    wait_until(admin_ready, "the gateway fetched the admin")
    with secure.admin() as admin:
        admin.create_topic(TOPIC, read_queue_nums=2)
        admin.create_user(CAROL.access_key, CAROL.secret_key)
        admin.create_acl(
            CAROL.access_key,
            [PolicyEntry(f"Topic:{TOPIC}", ["Pub", "Sub"]), PolicyEntry("Group:g-*", ["Sub"])],
        )


def _sent_as_carol(secure: Secure, count: int) -> set[str]:
    with Producer(secure.gateway, tls=secure.trust, credentials=CAROL) as producer:
        return {producer.send(TOPIC, f"secure {n}").msg_id for n in range(count)}


def test_tide_client_over_tls_with_credentials(secure: Secure) -> None:
    sent: set[str] = set()

    def produced() -> bool:  # carol and her grant reach the gateway within a refresh
        try:
            sent.update(_sent_as_carol(secure, 5))
        except (Unauthenticated, PermissionDenied):
            return False
        return True

    wait_until(produced, "carol's grant in effect")
    received: set[str] = set()
    with SimpleConsumer(
        GROUP, TOPIC, gateway=secure.gateway, tls=secure.trust, credentials=CAROL
    ) as consumer:

        def all_received() -> bool:
            batch = consumer.receive(16)
            received.update(message.message.msg_id for message in batch)
            if batch:
                consumer.ack_many(batch)
            return received >= sent

        wait_until(all_received, "carol received her messages")
    with (
        Admin(secure.gateway, tls=secure.trust, credentials=CAROL) as carol,
        pytest.raises(PermissionDenied) as denied,
    ):
        carol.create_topic("carol-may-not", read_queue_nums=1)
    secure.errors.append(str(denied.value))
    assert "Create" in str(denied.value) and "Topic:carol-may-not" in str(denied.value)


def test_pull_and_push_consumers_over_tls_with_credentials(secure: Secure) -> None:
    sent = _sent_as_carol(secure, 4)  # carol's grant is in effect (the test above)
    pulled: set[str] = set()
    with PullConsumer("g-carol-pull", secure.gateway, tls=secure.trust, credentials=CAROL) as pull:
        for queue in pull.queues(TOPIC):
            offset = 0
            for _ in range(100):  # bounded: the topic holds a few dozen messages
                result = pull.pull(queue, offset, max_messages=64)
                pulled.update(m.msg_id for m in result.messages)
                if not result.messages:
                    break
                offset = result.next_offset
    assert sent <= pulled
    pushed: set[str] = set()
    lock = threading.Lock()

    def record(message: ReceivedMessage) -> None:
        with lock:
            pushed.add(message.msg_id)

    with PushConsumer(
        "g-carol-push", TOPIC, "*", record, secure.gateway, consume_from="first",
        tls=secure.trust, credentials=CAROL,
    ):  # fmt: skip
        wait_until(lambda: sent <= pushed, "carol's push consumer got her messages")


def _cli(*args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tide.cli", *map(str, args)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env=env,
    )


def _cli_env(secure: Secure, credentials: Credentials | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    env |= {"TIDE_GATEWAY": secure.gateway, "TIDE_TLS_CA_FILE": str(secure.trust.ca_file)}
    if credentials is not None:
        env |= {
            "TIDE_ACCESS_KEY": credentials.access_key,
            "TIDE_SECRET_KEY": credentials.secret_key,
        }
    return env


def test_cli_and_bench_over_tls_with_credentials(secure: Secure, tmp_path: Path) -> None:
    secret_file = tmp_path / "carol.secret"
    secret_file.write_text(CAROL.secret_key)
    by_flags = _cli(
        "produce", TOPIC, "--count", "2", "--access-key", CAROL.access_key,
        "--secret-key-file", secret_file, env=_cli_env(secure, None),
    )  # fmt: skip
    assert by_flags.returncode == 0, by_flags.stderr
    unsigned = _cli("produce", TOPIC, "--count", "1", env=_cli_env(secure, None))
    assert unsigned.returncode != 0 and "unauthenticated" in unsigned.stderr.lower()
    secure.errors.append(unsigned.stderr)
    plaintext = {**_cli_env(secure, CAROL), "TIDE_TLS_CA_FILE": ""}
    refused = _cli("produce", TOPIC, "--count", "1", env=plaintext)
    assert refused.returncode != 0 and "unavailable" in refused.stderr.lower()

    bench = _cli(
        "bench", "run", tiny_workload(tmp_path), "--set", "topics=1", "--set", "warmup_s=0",
        "--set", "duration_s=1", "--set", "consumers_per_topic=0", "--json",
        env=_cli_env(secure, ADMIN),
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    report = json.loads(bench.stdout)
    assert report["totals"]["published"] > 0 and report["errors"] == 0, report


def test_official_client_over_tls_with_credentials(secure: Secure, tmp_path: Path) -> None:
    env = {
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(secure.trust.ca_file),
        "RMQ5_ACCESS_KEY": CAROL.access_key,
        "RMQ5_SECRET_KEY": CAROL.secret_key,
    }
    events = run_client(
        tmp_path, "produce", secure.gateway, TOPIC, "--count", "2", "--tls", env=env
    )
    assert len(of(events, "sent")) == 2
    wrong = {**env, "RMQ5_SECRET_KEY": "not-carols-secret-key"}
    refused = run_client(
        tmp_path, "produce", secure.gateway, TOPIC, "--tls", env=wrong, check=False
    )
    assert not of(refused, "sent") and of(refused, "error")


def _health(target: str, credentials: grpc.ChannelCredentials | None) -> None:
    channel = (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials)
    )
    with channel:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)


def test_plaintext_unsigned_and_certificate_less_clients_are_refused(secure: Secure) -> None:
    cluster = secure.cluster
    broker = cluster.brokers[0]
    internal = [cluster.nameservers[0].listen, broker.storage.listen, broker.dispatch.listen]
    for target in [secure.gateway, *internal]:
        with pytest.raises(grpc.RpcError) as plain:
            _health(target, None)
        assert plain.value.code() == grpc.StatusCode.UNAVAILABLE, target
    trust_only = channel_credentials(secure.trust)
    for target in internal:
        with pytest.raises(grpc.RpcError) as no_cert:
            _health(target, trust_only)
        assert no_cert.value.code() == grpc.StatusCode.UNAVAILABLE, target
    # A certificate the cluster CA signed but no cluster secret: refused before a handler.
    assert cluster.tls is not None
    with grpc.secure_channel(broker.storage.listen, channel_credentials(cluster.tls)) as channel:
        with pytest.raises(grpc.RpcError) as no_secret:
            StorageStub(channel).GetStatus(GetStatusRequest(), timeout=10)
        assert no_secret.value.code() == grpc.StatusCode.UNAUTHENTICATED
        secure.errors.append(no_secret.value.details() or "")
    with Producer(secure.gateway, tls=secure.trust) as anonymous, pytest.raises(Unauthenticated):
        anonymous.send(TOPIC, b"unsigned")


def _audit_lines(secure: Secure, resource: str) -> list[str]:
    log = secure.cluster.gateway.stderr().splitlines()
    return [line for line in log if "tide.audit" in line and f"resource={resource}" in line]


def _denials(secure: Secure) -> float:
    url = f"http://{secure.cluster.gateway.ready['metrics']}/metrics"
    page = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("tide_gateway_auth_denials_total{") and 'reason="forbidden"' in line
    )


def test_a_flood_of_denials_logs_bounded_events_and_counts_all(secure: Secure) -> None:
    before = _denials(secure)
    channel = grpc.secure_channel(secure.gateway, channel_credentials(secure.trust))
    stub = pb_grpc.GatewayStub(signed_channel(channel, CAROL))
    resource = "Topic:flooded"
    with channel:
        for _ in range(FLOOD):
            with pytest.raises(grpc.RpcError) as denied:
                stub.CreateTopic(pb.CreateTopicRequest(topic="flooded"), timeout=10)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    wait_until(lambda: _denials(secure) >= before + FLOOD, f"{FLOOD} denials counted")

    def summarized() -> bool:  # the auth refresh loop reports the suppressed rest
        return any("suppressed=" in line for line in _audit_lines(secure, resource))

    wait_until(summarized, "a 'denials suppressed' audit event")
    lines = _audit_lines(secure, resource)
    assert len(lines) < FLOOD // 2, lines
    logged = sum(1 for line in lines if "suppressed=" not in line)
    suppressed = sum(
        int(line.split("suppressed=")[1].split()[0]) for line in lines if "suppressed=" in line
    )
    assert logged + suppressed == FLOOD, lines


def test_no_secret_anywhere_after_the_run(secure: Secure) -> None:
    """Last of the module: every log file, span file, the gateway's metrics and every
    error message the clients saw, searched for every secret key and the cluster secret."""
    url = f"http://{secure.cluster.gateway.ready['metrics']}/metrics"
    texts = {
        "error messages": "\n".join(secure.errors),
        "gateway metrics": urllib.request.urlopen(url, timeout=10).read().decode(),
    }
    files = [p for p in secure.root.rglob("*") if p.is_file() and p.suffix in (".log", ".jsonl")]
    assert any(p.suffix == ".jsonl" for p in files), "no span file written"
    for path in files:
        texts[str(path)] = path.read_text(errors="replace")
    assert secure.errors, "no error message collected"
    for secret in (ADMIN.secret_key, CAROL.secret_key, CLUSTER_SECRET, "not-carols-secret-key"):
        leaks = [name for name, text in texts.items() if secret in text]
        assert not leaks, f"a secret appears in {leaks}"

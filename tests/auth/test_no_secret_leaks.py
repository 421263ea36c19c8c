"""No secret in logs, traces, metrics or error messages: a cluster with authentication,
the cluster secret and tracing to files, good and bad calls, then every log file, span
file, metrics page and error message is searched for every secret key and the cluster
secret (the storages' users.json holds the secret keys by design: it is not a log)."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc

from tests._cluster import Cluster
from tests.auth.conftest import ADMIN, init_user_file, stub_as
from tide.auth.client import Credentials
from tide.auth.signature import signed_metadata
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

CLUSTER_SECRET = "the-cluster-secret-0123456789"
BOB = Credentials("bob", "bobs-secret-key-0000")


def _secret_file(root: Path) -> Path:
    path = root / "cluster.secret"
    path.write_text(CLUSTER_SECRET)
    return path


def _traced(root: Path) -> list[str]:
    return [
        "--otel-traces-exporter",
        "file",
        "--otel-traces-file",
        str(root / "spans-{service}-{pid}.jsonl"),
    ]


def _calls(cluster: Cluster) -> list[str]:
    """Good and bad calls; the error messages they got."""
    admin = stub_as(cluster, ADMIN)
    wait_until(lambda: _ok(lambda: admin.ListUsers(pb.ListUsersRequest(), timeout=5)), "admin")
    admin.CreateTopic(
        pb.CreateTopicRequest(topic="leaks", read_queue_nums=1, write_queue_nums=1), timeout=30
    )
    user = storage_pb.AuthUser(access_key=BOB.access_key, secret_key=BOB.secret_key)
    admin.CreateUser(pb.UserRequest(user=user), timeout=10)
    acl = storage_pb.AuthAcl(
        access_key="bob",
        entries=[storage_pb.AuthPolicyEntry(resource="Topic:leaks", actions=["Pub"])],
    )
    admin.CreateAcl(pb.AclRequest(acl=acl), timeout=10)
    bob = stub_as(cluster, BOB)
    produce = pb.ProduceRequest(messages=[pb.ProduceMessage(topic="leaks", body=b"x")])
    wait_until(lambda: _ok(lambda: bob.Produce(produce, timeout=5)), "bob's grant")
    errors = []
    unsigned = stub_as(cluster, None)
    bad_calls: list[Callable[[], object]] = [
        lambda: bob.CreateTopic(pb.CreateTopicRequest(topic="nope"), timeout=5),
        lambda: unsigned.Produce(
            produce, metadata=signed_metadata("bob", "wrong-key-12345"), timeout=5
        ),
        lambda: unsigned.Produce(
            produce, metadata=signed_metadata("bob", BOB.secret_key, 1.0), timeout=5
        ),
        lambda: unsigned.Produce(produce, timeout=5),
        lambda: admin.CreateUser(pb.UserRequest(user=user), timeout=5),  # exists
        lambda: admin.CreateUser(
            pb.UserRequest(user=storage_pb.AuthUser(access_key="eve", secret_key="short")),
            timeout=5,
        ),
    ]
    for call in bad_calls:
        try:
            call()
        except grpc.RpcError as exc:
            errors.append(exc.details() or "")
    assert len(errors) == len(bad_calls)
    return errors


def _ok(call: object) -> bool:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError:
        return False
    return True


def test_no_secret_in_logs_traces_metrics_or_errors(tmp_path: Path) -> None:
    secret = ["--cluster-secret-file", str(_secret_file(tmp_path))]
    with Cluster(
        tmp_path / "cluster",
        brokers=1,
        nameserver_args=secret,
        storage_args=[
            *secret,
            "--auth-init-user-file",
            str(init_user_file(tmp_path)),
            *_traced(tmp_path),
        ],
        dispatch_args=secret,
        gateway_args=[
            *secret,
            "--auth-enabled",
            "--auth-refresh-interval-ms",
            "200",
            "--log-level",
            "debug",
            *_traced(tmp_path),
        ],
    ) as cluster:
        errors = _calls(cluster)
        metrics = (
            urllib.request.urlopen(f"http://{cluster.gateway.ready['metrics']}/metrics", timeout=10)
            .read()
            .decode()
        )
        assert "tide_gateway_auth_denials_total" in metrics
    texts = {"error messages": "\n".join(errors), "gateway metrics": metrics}
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".log", ".jsonl")]
    assert any(p.suffix == ".jsonl" for p in files), "no span file written"
    assert any("stderr" in p.name for p in files)
    for path in files:
        texts[str(path)] = path.read_text(errors="replace")
    for secret_value in (ADMIN.secret_key, BOB.secret_key, CLAIMED, CLUSTER_SECRET):
        leaks = [name for name, text in texts.items() if secret_value in text]
        assert not leaks, f"a secret appears in {leaks}"


CLAIMED = "wrong-key-12345"  # a wrong key a caller sent is not echoed either

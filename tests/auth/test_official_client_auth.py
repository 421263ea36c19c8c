"""The official RocketMQ 5 Python client (5.1.2) with credentials, unchanged, against a
gateway with --auth-enabled: its signature authenticates, ACL 2.0 decides, a refusal
comes back in-band (FORBIDDEN 40300, UNAUTHORIZED 40100)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests._cluster import Cluster
from tests.auth.conftest import ADMIN
from tests.auth.test_auth_cluster import ALICE, users  # noqa: F401  (the module fixture)
from tests.services.gateway.v2.rmq5 import of, run_client
from tide.auth.client import Credentials
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2_service
from tide.rocketmq_v2 import service_pb2_grpc as v2_grpc

pytestmark = pytest.mark.timeout(600)


def _env(credentials: Credentials) -> dict[str, str]:
    return {"RMQ5_ACCESS_KEY": credentials.access_key, "RMQ5_SECRET_KEY": credentials.secret_key}


@pytest.mark.parametrize("topic", ["orders", "logs-app", "lan"])  # literal, prefixed, CIDR
def test_a_granted_topic_takes_the_official_producers_messages(
    users: Cluster,  # noqa: F811
    tmp_path: Path,
    topic: str,
) -> None:
    events = run_client(
        tmp_path, "produce", users.gateway.listen, topic, "--count", "3", env=_env(ALICE)
    )
    assert len(of(events, "sent")) == 3


def test_a_granted_group_receives_with_the_official_simple_consumer(
    users: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    run_client(tmp_path, "produce", users.gateway.listen, "logs-app", env=_env(ADMIN))
    events = run_client(
        tmp_path,
        "simple",
        users.gateway.listen,
        "logs-app",
        "g-alice",
        "--count",
        "1",
        env=_env(ALICE),
    )
    assert of(events, "received")


@pytest.mark.parametrize(
    ("topic", "credentials", "reason"),
    [
        ("logs-secret", ALICE, "forbidden"),  # denied by a policy
        ("orders2", ALICE, "forbidden"),  # not granted (literal is exact)
        ("office", ALICE, "forbidden"),  # granted from 10.0.0.0/8 only
        ("orders", Credentials("alice", "not-alices-secret"), "unauthenticated"),
    ],
)
def test_the_official_client_is_refused(
    users: Cluster,  # noqa: F811
    tmp_path: Path,
    topic: str,
    credentials: Credentials,
    reason: str,
) -> None:
    events = run_client(
        tmp_path, "produce", users.gateway.listen, topic, env=_env(credentials), check=False
    )
    assert not of(events, "sent") and of(events, "error")  # it fails to fetch the route
    log = users.gateway.stderr()
    assert f"reason={reason}" in log and "what=/apache.rocketmq.v2.MessagingService/" in log
    assert credentials.secret_key not in log


@pytest.mark.parametrize(
    ("credentials", "code"),
    [(ALICE, v2.FORBIDDEN), (Credentials("alice", "not-alices-secret"), v2.UNAUTHORIZED)],
)
def test_v2_refusals_are_in_band(
    users: Cluster,  # noqa: F811
    credentials: Credentials,
    code: int,
) -> None:
    stub = v2_grpc.MessagingServiceStub(users.gateway.channel)
    request = v2_service.QueryRouteRequest(topic=v2.Resource(name="logs-secret"))
    reply = stub.QueryRoute(request, metadata=credentials.metadata(), timeout=10)
    assert reply.status.code == code
    assert credentials.secret_key not in reply.status.message
    if code == v2.FORBIDDEN:
        assert "Topic:logs-secret" in reply.status.message


def test_a_telemetry_stream_publishing_to_a_denied_topic_ends(
    users: Cluster,  # noqa: F811
) -> None:
    stub = v2_grpc.MessagingServiceStub(users.gateway.channel)
    settings = v2.Settings(publishing=v2.Publishing(topics=[v2.Resource(name="logs-secret")]))
    commands = iter([v2_service.TelemetryCommand(settings=settings)])
    with pytest.raises(grpc.RpcError) as caught:
        for _ in stub.Telemetry(commands, metadata=ALICE.metadata(), timeout=10):
            pass
    error = caught.value
    assert error.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "Pub on Topic:logs-secret" in (error.details() or "")

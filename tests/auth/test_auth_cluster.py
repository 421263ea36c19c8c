"""Authentication and ACL 2.0 authorization through tide.v1, on real processes: a
one-broker cluster with --auth-enabled, users and policies made through the admin API
(as `tide user` / `tide acl` do), the authorization matrix, bad signatures, the audit and
what the storage keeps."""

from __future__ import annotations

import stat
import time
from collections.abc import Sequence

import grpc
import pytest

from tests._cluster import Cluster
from tests._metrics import scrape, total
from tests.auth.conftest import ADMIN, REFRESH_MS, stub_as
from tide.auth.client import Credentials
from tide.auth.signature import AUTHORIZATION_KEY, DATE_TIME_KEY, signed_metadata
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

ALICE = Credentials("alice", "alice-secret-abcdefgh")
CAROL = Credentials("carol", "carol-secret-abcdefgh")
TOPICS = ("orders", "orders2", "logs-app", "logs-secret", "lan", "office")


def _entry(
    resource: str, *actions: str, deny: bool = False, sources: tuple[str, ...] = ()
) -> storage_pb.AuthPolicyEntry:
    return storage_pb.AuthPolicyEntry(
        resource=resource,
        actions=list(actions),
        decision="Deny" if deny else "Allow",
        source_ips=list(sources),
    )


@pytest.fixture(scope="module")
def users(auth_cluster: Cluster) -> Cluster:
    admin = stub_as(auth_cluster, ADMIN)
    wait_until(
        lambda: _works(lambda: admin.ListUsers(pb.ListUsersRequest(), timeout=5)), "the admin user"
    )
    for topic in TOPICS:
        admin.CreateTopic(
            pb.CreateTopicRequest(topic=topic, read_queue_nums=1, write_queue_nums=1), timeout=30
        )
    for credentials in (ALICE, CAROL):
        user = storage_pb.AuthUser(
            access_key=credentials.access_key, secret_key=credentials.secret_key
        )
        admin.CreateUser(pb.UserRequest(user=user), timeout=10)
    acl = storage_pb.AuthAcl(
        access_key="alice",
        entries=[
            _entry("Topic:orders", "Pub"),
            _entry("Topic:logs-*", "Pub", "Sub"),
            _entry("Topic:logs-secret", "All", deny=True),
            _entry("Group:*", "Sub"),
            _entry("Topic:lan", "Pub", sources=("127.0.0.0/8",)),
            _entry("Topic:office", "Pub", sources=("10.0.0.0/8",)),
        ],
    )
    admin.CreateAcl(pb.AclRequest(acl=acl), timeout=10)
    alice = stub_as(auth_cluster, ALICE)
    wait_until(lambda: _works(lambda: _produce(alice, "orders")), "alice's ACL in effect")
    return auth_cluster


def _works(call: object) -> bool:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError:
        return False
    return True


def _produce(stub: pb_grpc.GatewayStub, topic: str) -> pb.ProduceResponse:
    request = pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic, body=b"x")])
    return stub.Produce(request, timeout=10)


def _code(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    error = caught.value
    return error.code(), error.details() or ""


@pytest.mark.parametrize(
    ("topic", "allowed"),
    [
        ("orders", True),  # literal
        ("orders2", False),  # literal is exact
        ("logs-app", True),  # prefixed
        ("logs-secret", False),  # deny wins over the prefix
        ("lan", True),  # from 127.0.0.0/8
        ("office", False),  # only from 10.0.0.0/8
    ],
)
def test_pub_matrix(users: Cluster, topic: str, allowed: bool) -> None:
    alice = stub_as(users, ALICE)
    if allowed:
        assert _produce(alice, topic).results
        return
    code, details = _code(lambda: _produce(alice, topic))
    assert code is grpc.StatusCode.PERMISSION_DENIED
    assert f"may not Pub on Topic:{topic}" in details
    assert ALICE.secret_key not in details


def test_sub_and_admin_actions(users: Cluster) -> None:
    alice = stub_as(users, ALICE)
    pull = pb.PullRequest(
        consumer_group="g1", topic="orders", broker_name="broker-a", max_messages=1
    )
    code, details = _code(lambda: alice.Pull(pull, timeout=10))
    assert code is grpc.StatusCode.PERMISSION_DENIED and "Sub on Topic:orders" in details
    allowed = pb.PullRequest(
        consumer_group="g1", topic="logs-app", broker_name="broker-a", max_messages=1
    )
    alice.Pull(allowed, timeout=10)
    code, details = _code(
        lambda: alice.CreateTopic(pb.CreateTopicRequest(topic="mine"), timeout=10)
    )
    assert code is grpc.StatusCode.PERMISSION_DENIED and "Create on Topic:mine" in details
    code, _ = _code(lambda: alice.ListUsers(pb.ListUsersRequest(), timeout=10))
    assert code is grpc.StatusCode.PERMISSION_DENIED


def test_a_user_without_policies_may_do_nothing(users: Cluster) -> None:
    code, details = _code(lambda: _produce(stub_as(users, CAROL), "orders"))
    assert code is grpc.StatusCode.PERMISSION_DENIED and "(not granted)" in details


def _raw(stub: pb_grpc.GatewayStub, metadata: Sequence[tuple[str, str]]) -> object:
    return lambda: stub.Produce(
        pb.ProduceRequest(messages=[pb.ProduceMessage(topic="orders", body=b"x")]),
        metadata=tuple(metadata),
        timeout=10,
    )


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ([], "missing authorization"),
        (signed_metadata("alice", "wrong-secret-123"), "signature does not match"),
        (signed_metadata("nobody", "whatever-123"), "unknown access key"),
        (signed_metadata("alice", ALICE.secret_key, time.time() - 3600), "more than 900 s"),
        (signed_metadata("alice", ALICE.secret_key, time.time() + 3600), "more than 900 s"),
        ([(DATE_TIME_KEY, "20260101T000000Z"), (AUTHORIZATION_KEY, "HMAC-SHA256 x")], "algorithm"),
        (
            [(DATE_TIME_KEY, "x"), (AUTHORIZATION_KEY, "MQv2-HMAC-SHA1 " + "a" * 1_000)],
            "longer than",
        ),
        ([(DATE_TIME_KEY, "garbage"), (AUTHORIZATION_KEY, "MQv2-HMAC-SHA1 ,,,==,")], "malformed"),
    ],
)
def test_bad_signatures_are_unauthenticated(
    users: Cluster, metadata: Sequence[tuple[str, str]], expected: str
) -> None:
    code, details = _code(_raw(stub_as(users, None), metadata))
    assert code is grpc.StatusCode.UNAUTHENTICATED
    assert expected in details
    assert ALICE.secret_key not in details


def test_a_10_kb_header_is_refused_by_grpc_and_the_gateway_lives_on(users: Cluster) -> None:
    # gRPC's own bound on received metadata (8 KiB by default) refuses it before us.
    huge = [(DATE_TIME_KEY, "x"), (AUTHORIZATION_KEY, "MQv2-HMAC-SHA1 " + "a" * 10_240)]
    code, _ = _code(_raw(stub_as(users, None), huge))
    assert code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAUTHENTICATED)
    assert _produce(stub_as(users, ALICE), "orders").results


def test_health_stays_open(users: Cluster) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    reply = health_pb2_grpc.HealthStub(users.gateway.channel).Check(
        health_pb2.HealthCheckRequest(), timeout=5
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_changes_take_effect_without_restarts(users: Cluster) -> None:
    admin = stub_as(users, ADMIN)
    carol = stub_as(users, CAROL)
    acl = storage_pb.AuthAcl(access_key="carol", entries=[_entry("Topic:orders", "Pub")])
    admin.UpdateAcl(pb.AclRequest(acl=acl), timeout=10)
    wait_until(lambda: _works(lambda: _produce(carol, "orders")), "carol's grant in effect")
    admin.DeleteAcl(pb.AclRequest(acl=storage_pb.AuthAcl(access_key="carol")), timeout=10)
    wait_until(lambda: not _works(lambda: _produce(carol, "orders")), "carol's grant gone")
    disabled = storage_pb.AuthUser(access_key="carol", secret_key=CAROL.secret_key, disabled=True)
    admin.UpdateUser(pb.UserRequest(user=disabled), timeout=10)
    wait_until(
        lambda: _code(lambda: _produce(carol, "orders"))[0] is grpc.StatusCode.UNAUTHENTICATED,
        "carol disabled",
        timeout_s=REFRESH_MS / 1000 * 50,
    )


def test_users_are_listed_without_secrets_and_stored_private(users: Cluster) -> None:
    listed = stub_as(users, ADMIN).ListUsers(pb.ListUsersRequest(), timeout=10).users
    assert {u.access_key for u in listed} >= {"admin", "alice", "carol"}
    assert all(u.secret_key == "" for u in listed)
    config_dir = users.brokers[0].storage.store_dir / "config"
    for name in ("users.json", "acl.json"):
        assert stat.S_IMODE((config_dir / name).stat().st_mode) == 0o600


def test_bad_admin_input_is_named(users: Cluster) -> None:
    admin = stub_as(users, ADMIN)
    bad = storage_pb.AuthAcl(access_key="alice", entries=[_entry("Queue:x", "Pub")])
    code, details = _code(lambda: admin.UpdateAcl(pb.AclRequest(acl=bad), timeout=10))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "expected Topic:NAME" in details
    short = storage_pb.AuthUser(access_key="dave", secret_key="short")
    code, details = _code(lambda: admin.CreateUser(pb.UserRequest(user=short), timeout=10))
    assert (
        code is grpc.StatusCode.INVALID_ARGUMENT and "8..256" in details and "short" not in details
    )
    code, _ = _code(
        lambda: admin.CreateUser(
            pb.UserRequest(user=storage_pb.AuthUser(access_key="alice", secret_key="x" * 8)),
            timeout=10,
        )
    )
    assert code is grpc.StatusCode.ALREADY_EXISTS


def test_denials_are_audited_and_counted(users: Cluster) -> None:
    _code(lambda: _produce(stub_as(users, ALICE), "orders2"))
    _code(_raw(stub_as(users, None), []))
    log = users.gateway.stderr()
    assert "denied" in log and "who=alice" in log and "resource=Topic:orders2" in log
    assert "changed" in log and "who=admin" in log and "what=create_acl" in log
    metrics = str(users.gateway.ready["metrics"])
    wait_until(
        lambda: (
            total(scrape(metrics), "tide_gateway_auth_denials_total", reason="forbidden") > 0
            and total(scrape(metrics), "tide_gateway_auth_denials_total", reason="unauthenticated")
            > 0
        ),
        "denials counted",
    )


def test_each_produce_stream_request_is_authorized(users: Cluster) -> None:
    alice = stub_as(users, ALICE)
    requests = [
        pb.ProduceRequest(messages=[pb.ProduceMessage(topic="orders", body=b"x")]),
        pb.ProduceRequest(messages=[pb.ProduceMessage(topic="orders2", body=b"x")]),
    ]
    answers = []
    with pytest.raises(grpc.RpcError) as caught:
        for answer in alice.ProduceStream(iter(requests), timeout=10):
            answers.append(answer)
    error = caught.value
    assert error.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "Pub on Topic:orders2" in (error.details() or "")
    assert len(answers) <= 1  # the granted first request may have been answered


def test_tide_client_signs_with_credentials(users: Cluster) -> None:
    from tide.client import Admin, PermissionDenied, Unauthenticated

    with Admin(users.gateway.listen, credentials=ADMIN) as admin:
        assert "alice" in {u.access_key for u in admin.list_users()}
        assert admin.list_acls("alice")["alice"]
    with (
        Admin(users.gateway.listen, credentials=ALICE) as alice,
        pytest.raises(PermissionDenied, match="Create on Topic:by-client"),
    ):
        alice.create_topic("by-client")
    stranger = Credentials("alice", "not-the-secret-key")
    with (
        Admin(users.gateway.listen, credentials=stranger) as admin,
        pytest.raises(Unauthenticated, match="signature does not match") as caught,
    ):
        admin.list_users()
    assert stranger.secret_key not in str(caught.value)


def test_producer_signs_with_credentials(users: Cluster) -> None:
    """The console's resend jobs produce as the logged-in user (issue 23)."""
    from tide.client import PermissionDenied, Producer

    with Producer(users.gateway.listen, credentials=ALICE) as alice:
        assert alice.send("orders", "as alice").written
        with pytest.raises(PermissionDenied, match="Pub on Topic:orders2"):
            alice.send("orders2", "not hers")

"""Consumer group membership over real gRPC: ConsumerHeartbeat, GetConsumers,
UnregisterConsumer, expiry and bad input."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.services.storage.conftest import (
    RPC_TIMEOUT_S,
    StorageLauncher,
    StorageProcess,
    expect_error,
)
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until


def heartbeat(
    storage: StorageProcess, group: str, client_id: str, *subs: tuple[str, str]
) -> pb.ConsumerHeartbeatResponse:
    request = pb.ConsumerHeartbeatRequest(
        consumer_group=group,
        client_id=client_id,
        subscriptions=[pb.Subscription(topic=t, expression=e) for t, e in subs],
    )
    return storage.stub.ConsumerHeartbeat(request, timeout=RPC_TIMEOUT_S)


def members(storage: StorageProcess, group: str) -> list[pb.ConsumerMember]:
    request = pb.GetConsumersRequest(consumer_group=group)
    return list(storage.stub.GetConsumers(request, timeout=RPC_TIMEOUT_S).members)


def unregister(storage: StorageProcess, group: str, client_id: str) -> bool:
    request = pb.UnregisterConsumerRequest(consumer_group=group, client_id=client_id)
    return storage.stub.UnregisterConsumer(request, timeout=RPC_TIMEOUT_S).existed


def test_members_join_refresh_and_leave(shared_storage: StorageProcess) -> None:
    group = "G_join"
    reply = heartbeat(shared_storage, group, "host@2@1", ("TopicA", "TagA || TagB"))
    assert reply.expiry_ms == 120_000
    heartbeat(shared_storage, group, "host@1@1", ("TopicB", ""), ("TopicA", "*"))
    found = members(shared_storage, group)
    assert [m.client_id for m in found] == ["host@1@1", "host@2@1"]  # sorted
    assert [(s.topic, s.expression) for s in found[0].subscriptions] == [
        ("TopicA", "*"),
        ("TopicB", "*"),
    ]
    assert found[0].last_heartbeat_ms > 0
    heartbeat(shared_storage, group, "host@1@1", ("TopicC", "X"))  # replaces subscriptions
    found = members(shared_storage, group)
    assert [(s.topic, s.expression) for s in found[0].subscriptions] == [("TopicC", "X")]
    assert unregister(shared_storage, group, "host@1@1")
    assert not unregister(shared_storage, group, "host@1@1")
    assert [m.client_id for m in members(shared_storage, group)] == ["host@2@1"]
    assert members(shared_storage, "G_nobody") == []


@pytest.mark.parametrize(
    ("group", "client_id", "subs", "fragment"),
    [
        ("", "c", (), "consumer group is empty"),
        ("G x", "c", (), "consumer group 'G x' contains ' '"),
        ("G_bad", "", (), "client_id is empty"),
        ("G_bad", "c", (("a/b", "*"),), "subscriptions[0]: topic 'a/b' contains '/'"),
        ("G_bad", "c", (("T", "*"), ("T", "A")), "subscriptions[1]: topic 'T' is listed twice"),
    ],
)
def test_bad_heartbeats_are_invalid_argument(
    shared_storage: StorageProcess,
    group: str,
    client_id: str,
    subs: tuple[tuple[str, str], ...],
    fragment: str,
) -> None:
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: heartbeat(shared_storage, group, client_id, *subs),
        fragment,
    )


def test_bad_queries_are_invalid_argument(shared_storage: StorageProcess) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    expect_error(invalid, lambda: members(shared_storage, ""), "consumer group is empty")
    expect_error(invalid, lambda: unregister(shared_storage, "G", ""), "client_id is empty")


def test_silent_members_expire(launcher: StorageLauncher, tmp_path: Path) -> None:
    storage = launcher.start(tmp_path / "store", "--consumer-expiry-ms", "400")
    assert heartbeat(storage, "G_exp", "quiet").expiry_ms == 400

    def chatty_stays_quiet_goes() -> bool:
        heartbeat(storage, "G_exp", "chatty")  # "chatty" keeps heartbeating, "quiet" not
        return [m.client_id for m in members(storage, "G_exp")] == ["chatty"]

    wait_until(chatty_stays_quiet_goes, "the silent member to expire", timeout_s=10)
    wait_until(
        lambda: "consumer quiet of group G_exp expired" in storage.stderr(),
        "the expiry scan to log the removal",
        timeout_s=10,
    )
    storage.stop()

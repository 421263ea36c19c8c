"""Consumer group configs through the gateway: CreateGroup on every master broker (or the
named ones), GetGroup / ListGroups / DeleteGroup across them, bad input, and the stored
configs on each broker's storage."""

from __future__ import annotations

import grpc

from tests._cluster import Cluster
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

INVALID = grpc.StatusCode.INVALID_ARGUMENT

EXPONENTIAL = storage_pb.RetryPolicy(
    type=storage_pb.RetryPolicy.EXPONENTIAL, initial_ms=1000, max_ms=60_000, multiplier=3
)


def create(cluster: Cluster, group: storage_pb.GroupConfig, *brokers: str) -> list[str]:
    answer = cluster.gateway.stub.CreateGroup(
        pb.CreateGroupRequest(group=group, broker_names=list(brokers)), timeout=RPC_TIMEOUT_S
    )
    return list(answer.broker_names)


def get(cluster: Cluster, group: str) -> storage_pb.GetGroupResponse:
    answer: storage_pb.GetGroupResponse = cluster.gateway.stub.GetGroup(
        storage_pb.GetGroupRequest(group=group), timeout=RPC_TIMEOUT_S
    )
    return answer


def stored(cluster: Cluster, broker: str, group: str) -> storage_pb.GetGroupResponse:
    answer: storage_pb.GetGroupResponse = cluster.broker(broker).storage.stub.GetGroup(
        storage_pb.GetGroupRequest(group=group), timeout=RPC_TIMEOUT_S
    )
    return answer


def test_create_get_list_delete_on_every_master(cluster: Cluster) -> None:
    config = storage_pb.GroupConfig(
        group_name="g_gw_every",
        consume_enable=True,
        retry_max_times=5,
        retry_queue_nums=2,
        retry_policy=EXPONENTIAL,
    )
    assert create(cluster, config) == ["broker-a", "broker-b"]
    for broker in ("broker-a", "broker-b"):
        on_broker = stored(cluster, broker, "g_gw_every")
        assert on_broker.found and on_broker.group.retry_policy == EXPONENTIAL
    answer = get(cluster, "g_gw_every")
    assert answer.found
    assert (answer.group.retry_max_times, answer.group.retry_queue_nums) == (5, 2)

    listed = cluster.gateway.stub.ListGroups(storage_pb.ListGroupsRequest(), timeout=RPC_TIMEOUT_S)
    names = [g.group_name for g in listed.groups]
    assert "g_gw_every" in names and names == sorted(names)

    delete = cluster.gateway.stub.DeleteGroup
    assert delete(storage_pb.DeleteGroupRequest(group="g_gw_every"), timeout=RPC_TIMEOUT_S).existed
    assert not stored(cluster, "broker-a", "g_gw_every").found
    assert not stored(cluster, "broker-b", "g_gw_every").found
    again = delete(storage_pb.DeleteGroupRequest(group="g_gw_every"), timeout=RPC_TIMEOUT_S)
    assert not again.existed


def test_a_group_on_one_broker_is_found_and_unknown_groups_have_defaults(
    cluster: Cluster,
) -> None:
    config = storage_pb.GroupConfig(group_name="g_gw_one", consume_enable=True, retry_max_times=0)
    assert create(cluster, config, "broker-b") == ["broker-b"]
    assert not stored(cluster, "broker-a", "g_gw_one").found
    answer = get(cluster, "g_gw_one")
    assert answer.found and answer.group.retry_max_times == 0  # dead-letter at once

    defaults = get(cluster, "g_gw_nobody")
    assert not defaults.found
    assert (defaults.group.retry_max_times, defaults.group.consume_enable) == (16, True)


def test_bad_configs_are_invalid_and_name_the_field(cluster: Cluster) -> None:
    stub = cluster.gateway.stub
    expect_error(
        INVALID,
        lambda: create(cluster, storage_pb.GroupConfig(group_name="bad name")),
        "group.group_name",
    )
    expect_error(
        INVALID,
        lambda: create(cluster, storage_pb.GroupConfig(group_name="g" * 250)),
        "group.group_name",
        "retry topic",
    )
    expect_error(
        INVALID,
        lambda: create(cluster, storage_pb.GroupConfig(group_name="g_bad", retry_max_times=1001)),
        "UpsertGroup on broker",
        "group.retry_max_times is 1001; it must be 0..1000",
    )
    assert not get(cluster, "g_bad").found  # refused on every broker alike
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: create(cluster, storage_pb.GroupConfig(group_name="g_x"), "broker-zz"),
        "broker-zz",
    )
    expect_error(
        INVALID,
        lambda: stub.GetGroup(storage_pb.GetGroupRequest(group=""), timeout=RPC_TIMEOUT_S),
        "group",
        "empty",
    )


def test_a_group_with_consume_disabled_may_not_pull(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, brokers=["broker-a"])
    stub = cluster.gateway.stub
    stub.Produce(
        pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic_name, body=b"m")]),
        timeout=RPC_TIMEOUT_S,
    )
    cluster.wait_dispatched(topic_name, 1)

    def pull(group: str) -> pb.PullResponse:
        answer: pb.PullResponse = stub.Pull(
            pb.PullRequest(
                consumer_group=group, topic=topic_name, broker_name="broker-a", queue_id=0
            ),
            timeout=RPC_TIMEOUT_S,
        )
        return answer

    # Not asked before: the gateway has no cached answer for the group yet.
    off = storage_pb.GroupConfig(group_name="g_gw_off", consume_enable=False)
    create(cluster, off)
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: pull("g_gw_off"),
        "consumer group 'g_gw_off' may not consume on broker 'broker-a'",
        "--consume-enable",
    )
    assert len(pull("g_gw_other").messages) == 1  # other groups, and no group, read on
    assert len(pull("").messages) == 1

    create(cluster, storage_pb.GroupConfig(group_name="g_gw_off", consume_enable=True))
    # The gateway keeps a broker's answer a few seconds (CACHE_TTL_S).
    answers: list[object] = []

    def allowed() -> bool:
        try:
            answers.append(pull("g_gw_off"))
        except grpc.RpcError as exc:
            answers.append(exc)
            return False
        return True

    wait_until(allowed, "g_gw_off pulling again", state=lambda: answers[-1])

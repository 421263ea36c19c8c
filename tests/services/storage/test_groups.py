"""Consumer group configs on a real storage process: UpsertGroup, GetGroup, ListGroups,
DeleteGroup, the file they keep (``config/subscriptionGroup.json``) across a restart, bad
configs, and a slave's refusal."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from tests.services.storage.conftest import (
    RPC_TIMEOUT_S,
    StorageLauncher,
    StorageProcess,
    expect_error,
)
from tests.services.storage.test_replication import start_master, start_slave
from tide.v1 import storage_pb2 as pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def upsert(storage: StorageProcess, group: pb.GroupConfig) -> pb.GroupConfig:
    return storage.stub.UpsertGroup(pb.UpsertGroupRequest(group=group), timeout=RPC_TIMEOUT_S)


def get(storage: StorageProcess, group: str) -> pb.GetGroupResponse:
    return storage.stub.GetGroup(pb.GetGroupRequest(group=group), timeout=RPC_TIMEOUT_S)


def listed(storage: StorageProcess) -> dict[str, pb.GroupConfig]:
    answer = storage.stub.ListGroups(pb.ListGroupsRequest(), timeout=RPC_TIMEOUT_S)
    return {g.group_name: g for g in answer.groups}


def test_a_group_without_config_has_the_defaults(shared_storage: StorageProcess) -> None:
    answer = get(shared_storage, "NeverConfigured")
    assert not answer.found
    group = answer.group
    assert group.group_name == "NeverConfigured"
    assert (group.retry_max_times, group.retry_queue_nums) == (16, 1)
    assert group.consume_enable and group.consume_broadcast_enable
    assert group.retry_policy == pb.RetryPolicy(type=pb.RetryPolicy.CUSTOMIZED)
    assert group.consume_timeout_minute == 15


def test_upsert_get_list_delete_and_restart(launcher: StorageLauncher, tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    storage = launcher.start(store_dir)
    exponential = pb.GroupConfig(
        group_name="gExp",
        consume_enable=True,
        retry_max_times=3,
        retry_queue_nums=2,
        retry_policy=pb.RetryPolicy(type=pb.RetryPolicy.EXPONENTIAL, initial_ms=1000),
    )
    stored = upsert(storage, exponential)
    # The zeros took the defaults: 2 h max, doubling, 15 minutes.
    assert stored.retry_policy == pb.RetryPolicy(
        type=pb.RetryPolicy.EXPONENTIAL, initial_ms=1000, max_ms=7_200_000, multiplier=2
    )
    assert (stored.retry_max_times, stored.retry_queue_nums) == (3, 2)
    custom = pb.GroupConfig(
        group_name="gList",
        retry_max_times=-1,  # the default
        retry_policy=pb.RetryPolicy(delays_ms=[1000, 2000, 3000]),
        attributes={"note": "x"},
    )
    stored_custom = upsert(storage, custom)
    assert stored_custom.retry_max_times == 16
    assert not stored_custom.consume_enable  # as asked: a request is taken literally
    assert list(stored_custom.retry_policy.delays_ms) == [1000, 2000, 3000]
    assert get(storage, "gExp") == pb.GetGroupResponse(found=True, group=stored)
    assert listed(storage) == {"gExp": stored, "gList": stored_custom}

    doc = json.loads((store_dir / "config" / "subscriptionGroup.json").read_text())
    assert doc["subscriptionGroupTable"]["gList"]["groupRetryPolicy"] == {
        "customizedRetryPolicy": {"next": [1000, 2000, 3000]},
        "type": "CUSTOMIZED",
    }
    assert doc["dataVersion"]["counter"] == 2

    storage.stop()
    storage = launcher.start(store_dir)
    assert listed(storage) == {"gExp": stored, "gList": stored_custom}
    delete = storage.stub.DeleteGroup
    assert delete(pb.DeleteGroupRequest(group="gExp"), timeout=RPC_TIMEOUT_S).existed
    assert not delete(pb.DeleteGroupRequest(group="gExp"), timeout=RPC_TIMEOUT_S).existed
    assert not get(storage, "gExp").found
    assert list(listed(storage)) == ["gList"]


def policy(**fields: object) -> pb.RetryPolicy:
    return pb.RetryPolicy(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("group", "fragments"),
    [
        (pb.GroupConfig(group_name=""), ("group.group_name", "empty")),
        (pb.GroupConfig(group_name="bad name"), ("group.group_name", "allowed characters")),
        (pb.GroupConfig(group_name="g" * 250), ("group.group_name", "retry topic", "248")),
        (pb.GroupConfig(group_name="g", retry_max_times=1001), ("retry_max_times", "0..1000")),
        (pb.GroupConfig(group_name="g", retry_max_times=-2), ("retry_max_times", "-1 means")),
        (pb.GroupConfig(group_name="g", retry_queue_nums=1025), ("retry_queue_nums", "1..1024")),
        (pb.GroupConfig(group_name="g", retry_queue_nums=-1), ("retry_queue_nums", "1..1024")),
        (
            pb.GroupConfig(group_name="g", consume_timeout_minute=-5),
            ("consume_timeout_minute", "1..1440"),
        ),
        (
            pb.GroupConfig(group_name="g", retry_policy=policy(delays_ms=[1000, 0])),
            ("retry_policy.delays_ms[1]", "1..259200000 ms"),
        ),
        (
            pb.GroupConfig(group_name="g", retry_policy=policy(delays_ms=[1] * 65)),
            ("retry_policy.delays_ms", "65 entries", "RETRY_DELAYS_MAX_COUNT"),
        ),
        (
            pb.GroupConfig(
                group_name="g", retry_policy=policy(type=pb.RetryPolicy.EXPONENTIAL, max_ms=10)
            ),
            ("retry_policy.max_ms (10) is below initial_ms (5000)",),
        ),
        (
            pb.GroupConfig(
                group_name="g",
                retry_policy=policy(type=pb.RetryPolicy.EXPONENTIAL, multiplier=101),
            ),
            ("retry_policy.multiplier", "1..100"),
        ),
        (
            pb.GroupConfig(
                group_name="g",
                retry_policy=policy(type=pb.RetryPolicy.EXPONENTIAL, delays_ms=[1000]),
            ),
            ("delays_ms is for a CUSTOMIZED policy",),
        ),
        (
            pb.GroupConfig(group_name="g", retry_policy=policy(initial_ms=1000)),
            ("are for an EXPONENTIAL policy",),
        ),
        (pb.GroupConfig(group_name="g", retry_policy=policy(type=7)), ("retry_policy.type",)),
    ],
)
def test_a_bad_config_is_invalid_and_changes_nothing(
    shared_storage: StorageProcess, group: pb.GroupConfig, fragments: tuple[str, ...]
) -> None:
    before = listed(shared_storage)
    expect_error(INVALID, lambda: upsert(shared_storage, group), *fragments)
    assert listed(shared_storage) == before


def test_get_or_delete_with_a_bad_name_is_invalid(shared_storage: StorageProcess) -> None:
    expect_error(INVALID, lambda: get(shared_storage, "bad name"), "group:", "characters")
    expect_error(
        INVALID,
        lambda: shared_storage.stub.DeleteGroup(pb.DeleteGroupRequest(group="")),
        "group:",
        "empty",
    )


def test_a_slave_refuses_group_changes_and_serves_reads(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    master = start_master(launcher, tmp_path / "master")
    slave = start_slave(launcher, tmp_path / "slave", master.listen)
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: upsert(slave, pb.GroupConfig(group_name="g")),
        f"this storage is a slave of {master.listen}; change group configs on the master",
    )
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: slave.stub.DeleteGroup(pb.DeleteGroupRequest(group="g")),
        "change group configs on the master",
    )
    assert not get(slave, "g").found

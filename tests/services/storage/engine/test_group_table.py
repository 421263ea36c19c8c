"""The consumer group table: ``config/subscriptionGroup.json`` on real files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from services.storage.engine.group_table import GroupTable, default_group
from tide.files import ConfigFormatError, ConfigLimitError
from tide.format import (
    SUBSCRIPTION_GROUP_FILE,
    ExponentialRetryPolicy,
    GroupRetryPolicy,
    RetryPolicyType,
    SubscriptionGroupConfig,
)

# What a RocketMQ 5 broker writes for one group (fastjson), trimmed, with a forbidden
# table Tide does not act on but must keep.
ROCKETMQ_GROUPS_JSON = """{
  "dataVersion": {"counter": 3, "stateVersion": 0, "timestamp": 1700000000123},
  "forbiddenTable": {"g1": {"TopicA": 2}},
  "subscriptionGroupTable": {
    "g1": {"brokerId": 0, "consumeBroadcastEnable": true, "consumeEnable": true,
           "consumeFromMinEnable": true, "consumeMessageOrderly": false,
           "groupName": "g1", "groupRetryPolicy": {"type": "CUSTOMIZED"},
           "groupSysFlag": 0, "notifyConsumerIdsChangedEnable": true,
           "retryMaxTimes": 5, "retryQueueNums": 1, "whichBrokerWhenConsumeSlowly": 1}
  }
}"""


def clock() -> int:
    return 1_800_000_000_000


def test_upsert_get_list_delete_persist(tmp_path: Path) -> None:
    table = GroupTable(tmp_path, clock_ms=clock)
    assert table.get("g") is None
    cfg, found = table.get_or_default("g")
    assert not found and cfg == SubscriptionGroupConfig("g")
    assert cfg.retry_max_times == 16

    policy = GroupRetryPolicy(RetryPolicyType.EXPONENTIAL, ExponentialRetryPolicy(1000, 60_000, 3))
    wanted = SubscriptionGroupConfig("g", retry_max_times=3, group_retry_policy=policy)
    assert table.upsert(wanted) == wanted
    table.upsert(SubscriptionGroupConfig("a"))
    assert [c.group_name for c in table.list()] == ["a", "g"]
    assert table.table.data_version.counter == 2
    assert table.table.data_version.timestamp_ms == clock()

    doc = json.loads((tmp_path / SUBSCRIPTION_GROUP_FILE).read_text())
    entry = doc["subscriptionGroupTable"]["g"]
    assert entry["retryMaxTimes"] == 3
    assert entry["groupRetryPolicy"] == {
        "exponentialRetryPolicy": {"initial": 1000, "max": 60_000, "multiplier": 3},
        "type": "EXPONENTIAL",
    }

    reopened = GroupTable(tmp_path)
    assert reopened.get("g") == wanted
    assert reopened.table.data_version.counter == 2
    assert reopened.delete("g") and not reopened.delete("g")
    assert GroupTable(tmp_path).get("g") is None


def test_an_identical_upsert_changes_nothing(tmp_path: Path) -> None:
    table = GroupTable(tmp_path, clock_ms=clock)
    table.upsert(SubscriptionGroupConfig("g"))
    table.upsert(SubscriptionGroupConfig("g"))
    assert table.table.data_version.counter == 1


def test_reads_rocketmq_file_and_keeps_the_forbidden_table(tmp_path: Path) -> None:
    (tmp_path / SUBSCRIPTION_GROUP_FILE).write_text(ROCKETMQ_GROUPS_JSON)
    table = GroupTable(tmp_path, clock_ms=clock)
    g1 = table.get("g1")
    assert g1 is not None and g1.retry_max_times == 5
    table.upsert(dataclasses.replace(g1, retry_max_times=7))
    doc = json.loads((tmp_path / SUBSCRIPTION_GROUP_FILE).read_text())
    assert doc["forbiddenTable"] == {"g1": {"TopicA": 2}}
    assert doc["dataVersion"]["counter"] == 4
    assert doc["subscriptionGroupTable"]["g1"]["retryMaxTimes"] == 7


def test_the_group_limit(tmp_path: Path) -> None:
    table = GroupTable(tmp_path, max_groups=2)
    table.upsert(SubscriptionGroupConfig("a"))
    table.upsert(SubscriptionGroupConfig("b"))
    with pytest.raises(ConfigLimitError, match="limit of 2 groups"):
        table.upsert(SubscriptionGroupConfig("c"))
    table.upsert(SubscriptionGroupConfig("b", retry_max_times=1))  # a change fits
    with pytest.raises(ConfigLimitError, match="the limit is 1"):
        GroupTable(tmp_path, max_groups=1)


def test_a_damaged_file_refuses_to_load(tmp_path: Path) -> None:
    doc = json.loads(ROCKETMQ_GROUPS_JSON)
    doc["subscriptionGroupTable"]["g1"]["retryMaxTimes"] = 5000
    (tmp_path / SUBSCRIPTION_GROUP_FILE).write_text(json.dumps(doc))
    with pytest.raises(ConfigFormatError, match="retryMaxTimes is 5000"):
        GroupTable(tmp_path)


def test_default_group_refuses_a_bad_name() -> None:
    with pytest.raises(ValueError, match="retry topic"):
        default_group("g" * 250)


def test_install_replaces_the_table_with_another_brokers(tmp_path: Path) -> None:
    master = GroupTable(tmp_path / "master", clock_ms=clock)
    master.upsert(SubscriptionGroupConfig("g", retry_max_times=2))
    doc = json.loads(master.path.read_text())
    slave = GroupTable(tmp_path / "slave")
    slave.upsert(SubscriptionGroupConfig("only-here"))
    slave.install(master.path.read_bytes())
    assert [c.group_name for c in slave.list()] == ["g"]
    assert slave.table.data_version == master.table.data_version
    assert GroupTable(tmp_path / "slave").get("g") == master.get("g")
    doc["subscriptionGroupTable"]["g"]["retryMaxTimes"] = -3
    with pytest.raises(ConfigFormatError, match=r"retryMaxTimes is -3"):
        slave.install(json.dumps(doc).encode())
    assert slave.get("g") == master.get("g")  # unchanged

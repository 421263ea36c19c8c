"""Retry policies and config/subscriptionGroup.json, config/delayOffset.json."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tide.files import ConfigFormatError, parse_config_json
from tide.format import (
    DEFAULT_DELAY_LEVEL_TABLE,
    DEFAULT_RETRY_MAX_TIMES,
    MAX_CUSTOM_RETRY_DELAYS,
    MAX_RETRY_DELAY_MS,
    MAX_RETRY_MAX_TIMES,
    MAX_RETRY_MULTIPLIER,
    CustomizedRetryPolicy,
    DataVersion,
    DelayOffsets,
    ExponentialRetryPolicy,
    GroupRetryPolicy,
    RetryPolicyType,
    SimpleSubscription,
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
    decode_delay_offsets,
    decode_subscription_groups,
    encode_delay_offsets,
    encode_subscription_groups,
    retry_delay_level,
    should_dead_letter,
)

S, M, H = 1000, 60_000, 3_600_000

# A group as RocketMQ 5.3 writes it (fastjson: alphabetical fields, nulls left out).
ROCKETMQ_GROUP = """{
  "attributes": {},
  "brokerId": 0,
  "consumeBroadcastEnable": true,
  "consumeEnable": true,
  "consumeFromMinEnable": true,
  "consumeMessageOrderly": false,
  "consumeTimeoutMinute": 15,
  "groupName": "g1",
  "groupRetryPolicy": {"type": "CUSTOMIZED"},
  "groupSysFlag": 0,
  "notifyConsumerIdsChangedEnable": true,
  "retryMaxTimes": 16,
  "retryQueueNums": 1,
  "whichBrokerWhenConsumeSlowly": 1
}"""


def test_rocketmq4_levels_policy_in_ms() -> None:
    """The default (CUSTOMIZED, default list) is RocketMQ 4's level 3 + attempts: 10 s,
    30 s, 1 m, 2 m, ... 2 h, then 2 h for every later attempt."""
    policy = GroupRetryPolicy()
    delays = [policy.next_delay_ms(r) for r in range(17)]
    assert delays == [
        10 * S, 30 * S, 1 * M, 2 * M, 3 * M, 4 * M, 5 * M, 6 * M, 7 * M, 8 * M, 9 * M,
        10 * M, 20 * M, 30 * M, 1 * H, 2 * H, 2 * H,
    ]  # fmt: skip
    table = DEFAULT_DELAY_LEVEL_TABLE
    assert delays == [table.delay_ms(retry_delay_level(table, r)) for r in range(17)]
    assert policy.next_delay_ms(-3) == 10 * S


def test_rocketmq5_exponential_policy() -> None:
    """5 s doubling to 2 h (ExponentialRetryPolicyTest's values)."""
    policy = GroupRetryPolicy(RetryPolicyType.EXPONENTIAL, exponential=ExponentialRetryPolicy())
    delays = [policy.next_delay_ms(r) for r in range(13)]
    assert delays == [5_000 * 2**r for r in range(11)] + [2 * H, 2 * H]
    assert policy.next_delay_ms(10) == 5_120 * S
    assert policy.next_delay_ms(1_000_000) == 2 * H


def test_exponential_large_multiplier_saturates() -> None:
    """RocketMQ's long product overflows for 5 s * 3^32; Tide answers the max."""
    policy = ExponentialRetryPolicy(5_000, MAX_RETRY_DELAY_MS, 3)
    assert policy.next_delay_ms(32) == MAX_RETRY_DELAY_MS
    assert policy.next_delay_ms(2) == 45_000


def test_rocketmq_documented_values() -> None:
    """The values of RocketMQ's CustomizedRetryPolicyTest, ExponentialRetryPolicyTest and
    GroupRetryPolicyTest."""
    custom, exp = CustomizedRetryPolicy(), ExponentialRetryPolicy()
    assert [custom.next_delay_ms(r) for r in (0, 10, -1, 100)] == [10 * S, 9 * M, 10 * S, 2 * H]
    assert [exp.next_delay_ms(r) for r in (0, 10, -1, 100)] == [5 * S, 5_120 * S, 5 * S, 2 * H]
    assert GroupRetryPolicy().effective() == custom
    assert GroupRetryPolicy(RetryPolicyType.EXPONENTIAL).effective() == custom
    with_exp = GroupRetryPolicy(RetryPolicyType.EXPONENTIAL, exponential=exp)
    assert with_exp.effective() == exp
    null_type = GroupRetryPolicy.from_json({"type": None, "exponentialRetryPolicy": {}})
    assert null_type.effective() == custom


def test_customized_list() -> None:
    policy = CustomizedRetryPolicy((1 * S, 2 * S, 3 * S, 4 * S))
    assert [policy.next_delay_ms(r) for r in range(4)] == [3 * S, 4 * S, 4 * S, 4 * S]
    assert CustomizedRetryPolicy((7 * S,)).next_delay_ms(0) == 7 * S


def test_missing_policy_of_the_chosen_type_is_the_default_list() -> None:
    exp = GroupRetryPolicy(RetryPolicyType.EXPONENTIAL)
    assert exp.next_delay_ms(0) == 10 * S
    custom = GroupRetryPolicy(exponential=ExponentialRetryPolicy())
    assert custom.next_delay_ms(0) == 10 * S


def test_dead_letter_after_max_times() -> None:
    assert not should_dead_letter(15, DEFAULT_RETRY_MAX_TIMES)
    assert should_dead_letter(16, DEFAULT_RETRY_MAX_TIMES)
    assert should_dead_letter(0, 0)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: ExponentialRetryPolicy(0, H, 2), "initial is 0"),
        (lambda: ExponentialRetryPolicy(5_000, 1_000, 2), "below initial"),
        (lambda: ExponentialRetryPolicy(5_000, MAX_RETRY_DELAY_MS + 1, 2), "3 days"),
        (lambda: ExponentialRetryPolicy(5_000, H, 0), f"1..{MAX_RETRY_MULTIPLIER}"),
        (lambda: ExponentialRetryPolicy(5_000, H, MAX_RETRY_MULTIPLIER + 1), "multiplier"),
        (lambda: CustomizedRetryPolicy(()), "has 0 delays"),
        (lambda: CustomizedRetryPolicy((1,) * (MAX_CUSTOM_RETRY_DELAYS + 1)), "65 delays"),
        (lambda: CustomizedRetryPolicy((1_000, -5)), "next[1] is -5"),
    ],
)
def test_bad_policies(make: Any, says: str) -> None:
    with pytest.raises(ConfigFormatError) as info:
        make()
    assert says in str(info.value)


def _table(groups: dict[str, Any]) -> dict[str, Any]:
    return {"subscriptionGroupTable": groups}


def test_rocketmq_group_round_trip() -> None:
    """A RocketMQ-written entry parses to the defaults and dumps back field for field."""
    raw = json.loads(ROCKETMQ_GROUP)
    table = decode_subscription_groups(_table({"g1": raw}))
    cfg = table.groups["g1"]
    assert cfg == SubscriptionGroupConfig("g1")
    assert cfg.retry_max_times == 16 and cfg.retry_queue_nums == 1
    dumped = encode_subscription_groups(table)
    assert dumped["subscriptionGroupTable"] == {"g1": raw}
    assert list(raw) == list(cfg.to_json())  # the same (alphabetical) field order
    assert table.data_version == DataVersion()


def test_every_field_round_trips() -> None:
    cfg = SubscriptionGroupConfig(
        group_name="g2",
        consume_enable=False,
        consume_from_min_enable=False,
        consume_broadcast_enable=False,
        consume_message_orderly=True,
        retry_queue_nums=4,
        retry_max_times=3,
        group_retry_policy=GroupRetryPolicy(
            RetryPolicyType.EXPONENTIAL,
            exponential=ExponentialRetryPolicy(1_000, 60_000, 3),
            customized=CustomizedRetryPolicy((5_000, 6_000)),
        ),
        broker_id=1,
        which_broker_when_consume_slowly=2,
        notify_consumer_ids_changed_enable=False,
        group_sys_flag=1,
        consume_timeout_minute=30,
        subscription_data_set=(SimpleSubscription("TopicTest", "TAG", "TagA || TagB", 7),),
        attributes={"+k": "v"},
    )
    table = SubscriptionGroupTable(
        {"g2": cfg}, {"g2": {"TopicTest": 1}}, DataVersion(0, 1_700_000_000_000, 5)
    )
    text = json.dumps(encode_subscription_groups(table))
    assert decode_subscription_groups(json.loads(text)) == table
    policy = json.loads(text)["subscriptionGroupTable"]["g2"]["groupRetryPolicy"]
    assert policy == {
        "customizedRetryPolicy": {"next": [5000, 6000]},
        "exponentialRetryPolicy": {"initial": 1000, "max": 60000, "multiplier": 3},
        "type": "EXPONENTIAL",
    }


def test_missing_fields_take_rocketmqs_defaults() -> None:
    table = decode_subscription_groups(_table({"g1": {"groupName": "g1"}}))
    assert table.groups["g1"] == SubscriptionGroupConfig("g1")
    assert decode_subscription_groups({}).groups == {}


def test_unknown_fields_are_dropped() -> None:
    table = decode_subscription_groups(_table({"g1": {"groupName": "g1", "newField": 1}}))
    assert "newField" not in table.groups["g1"].to_json()


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"groupName": "g2"}, "groupName is 'g2', not the table key"),
        ({"retryMaxTimes": -1}, f"retryMaxTimes is -1; it must be 0..{MAX_RETRY_MAX_TIMES}"),
        ({"retryMaxTimes": MAX_RETRY_MAX_TIMES + 1}, "retryMaxTimes"),
        ({"retryMaxTimes": "16"}, "retryMaxTimes is '16'; it must be an integer"),
        ({"retryMaxTimes": True}, "it must be an integer"),
        ({"retryQueueNums": 0}, "retryQueueNums is 0; it must be 1..1024"),
        ({"consumeEnable": 1}, "consumeEnable is 1; it must be true or false"),
        ({"consumeTimeoutMinute": 0}, "consumeTimeoutMinute"),
        ({"groupRetryPolicy": {"type": "LINEAR"}}, "must be EXPONENTIAL or CUSTOMIZED"),
        ({"groupRetryPolicy": {"customizedRetryPolicy": {"next": []}}}, "has 0 delays"),
        ({"groupRetryPolicy": {"customizedRetryPolicy": {"next": [1] * 10_000}}}, "10000"),
        ({"groupRetryPolicy": {"exponentialRetryPolicy": {"max": 1}}}, "below initial"),
        ({"groupRetryPolicy": []}, "groupRetryPolicy must be a JSON object"),
        ({"attributes": {"k": 1}}, "attribute 'k' is 1"),
        ({"subscriptionDataSet": {}}, "subscriptionDataSet must be a list"),
    ],
)
def test_bad_group_entries(entry: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigFormatError) as info:
        decode_subscription_groups(_table({"g1": {"groupName": "g1", **entry}}))
    assert says in str(info.value)
    assert "g1" in str(info.value)


@pytest.mark.parametrize(
    ("name", "says"),
    [("bad/name", "contains '/'"), ("g" * 249, "limited to 248"), ("", "empty")],
)
def test_bad_group_names(name: str, says: str) -> None:
    with pytest.raises(ConfigFormatError, match=None) as info:
        SubscriptionGroupConfig(name)
    assert says in str(info.value)


def test_bad_value_is_quoted_bounded() -> None:
    with pytest.raises(ConfigFormatError) as info:
        decode_subscription_groups(_table({"g1": {"retryMaxTimes": "x" * 5000}}))
    assert len(str(info.value)) < 300


def test_forbidden_table_and_data_version() -> None:
    doc = {
        "forbiddenTable": {"g1": {"TopicTest": 1}},
        "dataVersion": {"counter": 2, "stateVersion": 0, "timestamp": 5},
    }
    table = decode_subscription_groups(doc)
    assert table.forbidden == {"g1": {"TopicTest": 1}}
    assert table.data_version == DataVersion(0, 5, 2)
    assert table.data_version.next(9) == DataVersion(0, 9, 3)
    with pytest.raises(ConfigFormatError, match="TopicTest is -1"):
        decode_subscription_groups({"forbiddenTable": {"g1": {"TopicTest": -1}}})


def test_worked_example_delay_offsets() -> None:
    """docs/formats.md, "config/delayOffset.json": a fastjson file (bare keys) and what
    Tide writes back (quoted keys, levels in order)."""
    rocketmq = '{"dataVersion":{"counter":3,"stateVersion":0,"timestamp":1700000000000},'
    rocketmq += '"offsetTable":{3:0,1:12}}'
    table = decode_delay_offsets(parse_config_json(rocketmq))
    assert table == DelayOffsets({1: 12, 3: 0}, DataVersion(0, 1_700_000_000_000, 3))
    assert table.offset(1) == 12 and table.offset(2) == 0
    assert json.dumps(encode_delay_offsets(table), separators=(",", ":")) == (
        '{"dataVersion":{"counter":3,"stateVersion":0,"timestamp":1700000000000},'
        '"offsetTable":{"1":12,"3":0}}'
    )
    assert decode_delay_offsets(encode_delay_offsets(table)) == table


def test_rocketmq4_delay_offsets_without_data_version() -> None:
    table = decode_delay_offsets({"offsetTable": {"18": 7}})
    assert table == DelayOffsets({18: 7})


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"offsetTable": {"0": 1}}, "key 0 must be 1..64"),
        ({"offsetTable": {"65": 1}}, "key 65 must be 1..64"),
        ({"offsetTable": {"x": 1}}, "key 'x' is not an integer"),
        ({"offsetTable": {"1": -1}}, "level 1 has offset -1"),
        ({"offsetTable": {"1": "5"}}, "level 1 has offset '5'"),
        ({"offsetTable": {"1": 1, "01": 2}}, "names a delay level twice"),
        ({"offsetTable": []}, "offsetTable must be a JSON object"),
        ({"dataVersion": {"counter": -1}}, "counter is -1"),
        ([], "the document must be a JSON object"),
    ],
)
def test_bad_delay_offsets(doc: Any, says: str) -> None:
    with pytest.raises(ConfigFormatError) as info:
        decode_delay_offsets(doc)
    assert says in str(info.value)

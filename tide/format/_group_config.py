"""``config/subscriptionGroup.json``: consumer group configs (RocketMQ's SubscriptionGroupManager).

docs/formats.md, "config/subscriptionGroup.json"::

    {"dataVersion": {"counter": 1, "stateVersion": 0, "timestamp": <ms>},
     "forbiddenTable": {"<group>": {"<topic>": <perm bits>}},
     "subscriptionGroupTable": {"<group>": {"groupName": "<group>", "retryMaxTimes": 16,
        "retryQueueNums": 1, "groupRetryPolicy": {"type": "CUSTOMIZED"}, ...}}}

Every field of RocketMQ 5's ``SubscriptionGroupConfig`` is kept (fields a file leaves out
take RocketMQ's defaults; fields Tide does not know are dropped, as fastjson does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tide.files import ConfigFormatError
from tide.format._config_json import (
    INT32_MAX,
    INT64_MAX,
    DataVersion,
    as_object,
    int_field,
    show,
    typed_field,
)
from tide.format._retry_policy import GroupRetryPolicy
from tide.format._system_topics import group_topic_error
from tide.naming import consumer_group_error

SUBSCRIPTION_GROUP_FILE = "subscriptionGroup.json"  # under config/
DEFAULT_RETRY_MAX_TIMES = 16
MAX_RETRY_MAX_TIMES = 1000
"""Most attempts a group may ask for (1000; at the default list's 2 h cap that is over
80 days of retrying one message)."""
DEFAULT_RETRY_QUEUE_NUMS = 1
MAX_RETRY_QUEUE_NUMS = 1024
"""Queues of a ``%RETRY%`` topic: a topic's queue count limit (the topic table's 1024)."""
MAX_SUBSCRIPTION_GROUPS = 100_000
"""Groups one file may hold, like the topic table's topic limit."""
DEFAULT_CONSUME_TIMEOUT_MINUTE = 15
MAX_CONSUME_TIMEOUT_MINUTE = 24 * 60


@dataclass(frozen=True, slots=True)
class SimpleSubscription:
    """One entry of ``subscriptionDataSet`` (RocketMQ's SimpleSubscriptionData)."""

    topic: str
    expression_type: str = "TAG"
    expression: str = "*"
    version: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "expression": self.expression,
            "expressionType": self.expression_type,
            "topic": self.topic,
            "version": self.version,
        }

    @classmethod
    def from_json(cls, raw: object, where: str) -> SimpleSubscription:
        doc = as_object(raw, where)
        return cls(
            topic=typed_field(doc, where, "topic", str, ""),
            expression_type=typed_field(doc, where, "expressionType", str, "TAG"),
            expression=typed_field(doc, where, "expression", str, "*"),
            version=int_field(doc, where, "version", 0, -INT64_MAX - 1, INT64_MAX),
        )


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False
    retry_queue_nums: int = DEFAULT_RETRY_QUEUE_NUMS
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES
    group_retry_policy: GroupRetryPolicy = field(default_factory=GroupRetryPolicy)
    broker_id: int = 0  # MixAll.MASTER_ID
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    group_sys_flag: int = 0
    consume_timeout_minute: int = DEFAULT_CONSUME_TIMEOUT_MINUTE
    subscription_data_set: tuple[SimpleSubscription, ...] | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        error = consumer_group_error(self.group_name) or group_topic_error(self.group_name)
        if error is not None:
            raise ConfigFormatError(error)
        where = f"group {show(self.group_name)}"
        values = {
            "retryQueueNums": self.retry_queue_nums,
            "retryMaxTimes": self.retry_max_times,
            "brokerId": self.broker_id,
            "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly,
            "groupSysFlag": self.group_sys_flag,
            "consumeTimeoutMinute": self.consume_timeout_minute,
        }
        for name, value in values.items():
            _default, low, high = _NUMBERS[name]
            if type(value) is not int or not low <= value <= high:
                raise ConfigFormatError(
                    f"{where}: {name} is {show(value)}; it must be {low}..{high}"
                )

    def to_json(self) -> dict[str, object]:
        """The table entry, fields in fastjson's (alphabetical) order, nulls left out."""
        doc: dict[str, object] = {
            "attributes": dict(self.attributes),
            "brokerId": self.broker_id,
            "consumeBroadcastEnable": self.consume_broadcast_enable,
            "consumeEnable": self.consume_enable,
            "consumeFromMinEnable": self.consume_from_min_enable,
            "consumeMessageOrderly": self.consume_message_orderly,
            "consumeTimeoutMinute": self.consume_timeout_minute,
            "groupName": self.group_name,
            "groupRetryPolicy": self.group_retry_policy.to_json(),
            "groupSysFlag": self.group_sys_flag,
            "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
            "retryMaxTimes": self.retry_max_times,
            "retryQueueNums": self.retry_queue_nums,
        }
        if self.subscription_data_set is not None:
            doc["subscriptionDataSet"] = [s.to_json() for s in self.subscription_data_set]
        doc["whichBrokerWhenConsumeSlowly"] = self.which_broker_when_consume_slowly
        return doc

    @classmethod
    def from_json(cls, key: str, raw: object) -> SubscriptionGroupConfig:
        """Parse and check one ``subscriptionGroupTable`` entry."""
        where = f"group {show(key)}"
        doc = as_object(raw, where)
        name = typed_field(doc, where, "groupName", str, key)
        if name != key:
            raise ConfigFormatError(f"{where}: groupName is {show(name)}, not the table key")
        flags = _flags(doc, where)
        numbers = _numbers(doc, where)
        return cls(
            group_name=name,
            consume_enable=flags["consumeEnable"],
            consume_from_min_enable=flags["consumeFromMinEnable"],
            consume_broadcast_enable=flags["consumeBroadcastEnable"],
            consume_message_orderly=flags["consumeMessageOrderly"],
            notify_consumer_ids_changed_enable=flags["notifyConsumerIdsChangedEnable"],
            retry_queue_nums=numbers["retryQueueNums"],
            retry_max_times=numbers["retryMaxTimes"],
            broker_id=numbers["brokerId"],
            which_broker_when_consume_slowly=numbers["whichBrokerWhenConsumeSlowly"],
            group_sys_flag=numbers["groupSysFlag"],
            consume_timeout_minute=numbers["consumeTimeoutMinute"],
            group_retry_policy=_retry_policy(doc.get("groupRetryPolicy"), where),
            subscription_data_set=_subscriptions(doc.get("subscriptionDataSet"), where),
            attributes=_attributes(doc.get("attributes"), where),
        )


# (default, low, high) of each int field; fastjson names.
_FLAGS = {
    "consumeEnable": True,
    "consumeFromMinEnable": True,
    "consumeBroadcastEnable": True,
    "consumeMessageOrderly": False,
    "notifyConsumerIdsChangedEnable": True,
}
_NUMBERS = {
    "retryQueueNums": (DEFAULT_RETRY_QUEUE_NUMS, 1, MAX_RETRY_QUEUE_NUMS),
    "retryMaxTimes": (DEFAULT_RETRY_MAX_TIMES, 0, MAX_RETRY_MAX_TIMES),
    "brokerId": (0, 0, INT64_MAX),
    "whichBrokerWhenConsumeSlowly": (1, 0, INT64_MAX),
    "groupSysFlag": (0, 0, INT32_MAX),
    "consumeTimeoutMinute": (DEFAULT_CONSUME_TIMEOUT_MINUTE, 1, MAX_CONSUME_TIMEOUT_MINUTE),
}


def _flags(doc: dict[str, object], where: str) -> dict[str, bool]:
    return {name: typed_field(doc, where, name, bool, d) for name, d in _FLAGS.items()}


def _numbers(doc: dict[str, object], where: str) -> dict[str, int]:
    return {
        name: int_field(doc, where, name, default, low, high)
        for name, (default, low, high) in _NUMBERS.items()
    }


def _retry_policy(raw: object, where: str) -> GroupRetryPolicy:
    if raw is None:
        return GroupRetryPolicy()
    try:
        return GroupRetryPolicy.from_json(raw)
    except ConfigFormatError as exc:
        raise ConfigFormatError(f"{where}: {exc}") from exc


def _subscriptions(raw: object, where: str) -> tuple[SimpleSubscription, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ConfigFormatError(f"{where}: subscriptionDataSet must be a list, got {show(raw)}")
    return tuple(
        SimpleSubscription.from_json(item, f"{where}: subscriptionDataSet[{i}]")
        for i, item in enumerate(raw)
    )


def _attributes(raw: object, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    doc = as_object(raw, f"{where}: attributes")
    for name, value in doc.items():
        if type(value) is not str:
            raise ConfigFormatError(
                f"{where}: attribute {show(name)} is {show(value)}; it must be a string"
            )
    return dict(doc)  # type: ignore[arg-type]  # every value is a str, checked above


@dataclass(frozen=True, slots=True)
class SubscriptionGroupTable:
    groups: Mapping[str, SubscriptionGroupConfig]
    forbidden: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    data_version: DataVersion = field(default_factory=DataVersion)


def encode_subscription_groups(table: SubscriptionGroupTable) -> dict[str, object]:
    """The ``subscriptionGroup.json`` document (groups sorted by name)."""
    return {
        "dataVersion": table.data_version.to_json(),
        "forbiddenTable": {g: dict(table.forbidden[g]) for g in sorted(table.forbidden)},
        "subscriptionGroupTable": {g: table.groups[g].to_json() for g in sorted(table.groups)},
    }


def decode_subscription_groups(raw: object) -> SubscriptionGroupTable:
    """Parse and check a ``subscriptionGroup.json`` document; ConfigFormatError says what
    is wrong and where."""
    doc = as_object(raw, "the document")
    table = as_object(doc.get("subscriptionGroupTable", {}), "subscriptionGroupTable")
    if len(table) > MAX_SUBSCRIPTION_GROUPS:
        raise ConfigFormatError(
            f"subscriptionGroupTable has {len(table)} groups; the limit is "
            f"{MAX_SUBSCRIPTION_GROUPS}"
        )
    groups = {key: SubscriptionGroupConfig.from_json(key, entry) for key, entry in table.items()}
    return SubscriptionGroupTable(
        groups=groups,
        forbidden=_forbidden(doc.get("forbiddenTable")),
        data_version=DataVersion.from_json(doc.get("dataVersion")),
    )


def _forbidden(raw: object) -> dict[str, dict[str, int]]:
    if raw is None:
        return {}
    table = as_object(raw, "forbiddenTable")
    result: dict[str, dict[str, int]] = {}
    for group, topics in table.items():
        where = f"forbiddenTable: group {show(group)}"
        entry = as_object(topics, where)
        result[group] = {t: int_field(entry, where, t, 0, 0, INT32_MAX) for t in entry}
    return result

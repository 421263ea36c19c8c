"""Protobuf <-> engine types, at the service edge only."""

from __future__ import annotations

import dataclasses
from typing import Any

from services.storage.engine.topic_table import TopicConfig
from tide.files import ConfigFormatError
from tide.format import (
    DEFAULT_EXPONENTIAL_INITIAL_MS,
    DEFAULT_EXPONENTIAL_MAX_MS,
    DEFAULT_EXPONENTIAL_MULTIPLIER,
    DEFAULT_RETRY_MAX_TIMES,
    DEFAULT_RETRY_QUEUE_NUMS,
    KEYS,
    MAX_CONSUME_TIMEOUT_MINUTE,
    MAX_CUSTOM_RETRY_DELAYS,
    MAX_RETRY_DELAY_MS,
    MAX_RETRY_MAX_TIMES,
    MAX_RETRY_MULTIPLIER,
    MAX_RETRY_QUEUE_NUMS,
    TAGS,
    CustomizedRetryPolicy,
    ExponentialRetryPolicy,
    GroupRetryPolicy,
    RetryPolicyType,
    SubscriptionGroupConfig,
    group_topic_error,
    unpack_host,
    v4_record_fields,
)
from tide.format._group_config import DEFAULT_CONSUME_TIMEOUT_MINUTE  # not exported
from tide.naming import consumer_group_error
from tide.quoting import quote
from tide.v1 import storage_pb2 as pb

MAX_CACHED_HOSTS = 10_000


class BadRequest(ValueError):
    """A request field that cannot be converted (INVALID_ARGUMENT)."""


def stored_message_fields(
    data: bytes, offset: int, hosts: dict[bytes, str]
) -> dict[str, Any] | None:
    """The ``StoredMessage`` fields (zero values left out) of the record ``data`` read at
    ``offset``, or None: :func:`stored_messages_fields` of one record."""
    found = stored_messages_fields(data, [offset], hosts)
    return None if found is None else found[0]


def stored_messages_fields(
    records: bytes, offsets: list[int], hosts: dict[bytes, str]
) -> list[dict[str, Any]] | None:
    """The ``StoredMessage`` fields (zero values left out) of the records back to back in
    ``records``, the i-th read at ``offsets[i]``, when each is a common record (1-byte
    topic length, IPv4 hosts) that passes the reader's checks (size, magic, field
    lengths, physical offset, body CRC, UTF-8 topic); None otherwise: the caller then
    reads them one by one, and the general decoder says what is wrong. The same values
    as :func:`tide.stored.stored_message` of ``decode_record``, read by tide.format's one
    record reader (``v4_record_fields``, compiled when built) in one call for the whole
    Read. ``hosts`` caches packed host -> ``ip:port`` text."""
    columns = v4_record_fields(records, len(offsets), stored=True)
    if columns is None or columns[3] != offsets:  # (physical offsets: where they were read)
        return None
    try:
        return [_fields(row, hosts) for row in zip(*columns, strict=True)]
    except UnicodeDecodeError:  # a topic that is not UTF-8
        return None


def _fields(row: tuple[Any, ...], hosts: dict[bytes, str]) -> dict[str, Any]:
    """One record's StoredMessage fields from its row of ``v4_record_fields``' columns."""
    (
        size,
        queue_id,
        queue_offset,
        physical_offset,
        born_timestamp_ms,
        store_timestamp_ms,
        born,
        store,
        reconsume_times,
        body,
        topic,
        props,
        flag,
        sys_flag,
        prepared_transaction_offset,
        body_crc,
    ) = row
    fields: dict[str, Any] = {
        "topic": topic.decode("utf-8"),
        "body": body,
        "born_timestamp_ms": born_timestamp_ms,
        "born_host": hosts.get(born) or _host_text(born, hosts),
        "queue_offset": queue_offset,
        "physical_offset": physical_offset,
        "size": size,
        "store_timestamp_ms": store_timestamp_ms,
        "store_host": hosts.get(store) or _host_text(store, hosts),
        "body_crc": body_crc,
        # make_msg_id inline: the packed store host is the id's prefix (on a slave too).
        "msg_id": f"{store.hex().upper()}{physical_offset:016X}",
    }
    if props:
        fields["properties"] = props
        tags = props.get(TAGS)
        if tags:
            fields["tags"] = tags
        keys = props.get(KEYS)
        if keys:
            fields["keys"] = keys.split(" ")
    if queue_id:
        fields["queue_id"] = queue_id
    if flag:
        fields["flag"] = flag
    if sys_flag:
        fields["sys_flag"] = sys_flag
    if reconsume_times:
        fields["reconsume_times"] = reconsume_times
    if prepared_transaction_offset:
        fields["prepared_transaction_offset"] = prepared_transaction_offset
    return fields


def _host_text(packed: bytes, hosts: dict[bytes, str]) -> str:
    """``ip:port`` of a packed IPv4 host (as ``str(unpack_host(packed))``), cached."""
    text = str(unpack_host(packed))
    if len(hosts) < MAX_CACHED_HOSTS:
        hosts[packed] = text
    return text


def topic_to_pb(cfg: TopicConfig) -> pb.TopicConfig:
    return pb.TopicConfig(
        topic_name=cfg.topic_name,
        read_queue_nums=cfg.read_queue_nums,
        write_queue_nums=cfg.write_queue_nums,
        perm=cfg.perm,
        topic_sys_flag=cfg.topic_sys_flag,
        order=cfg.order,
        attributes=dict(cfg.attributes),
    )


def topic_from_pb(msg: pb.TopicConfig) -> TopicConfig:
    if msg.read_queue_nums == 0 and msg.write_queue_nums == 0:
        raise BadRequest("topic.read_queue_nums and topic.write_queue_nums must be set (>= 1)")
    return TopicConfig(
        topic_name=msg.topic_name,
        read_queue_nums=msg.read_queue_nums,
        write_queue_nums=msg.write_queue_nums,
        perm=msg.perm or 6,
        topic_sys_flag=msg.topic_sys_flag,
        order=msg.order,
        attributes=dict(msg.attributes),
    )


# -- consumer group configs ----------------------------------------------------------
_POLICY_TYPES = {
    pb.RetryPolicy.CUSTOMIZED: RetryPolicyType.CUSTOMIZED,
    pb.RetryPolicy.EXPONENTIAL: RetryPolicyType.EXPONENTIAL,
}
_RETRY_MAX_TIMES_DEFAULT_MARK = -1  # a request's "the default (16)"


def group_to_pb(cfg: SubscriptionGroupConfig) -> pb.GroupConfig:
    return pb.GroupConfig(
        group_name=cfg.group_name,
        consume_enable=cfg.consume_enable,
        retry_queue_nums=cfg.retry_queue_nums,
        retry_max_times=cfg.retry_max_times,
        retry_policy=_policy_to_pb(cfg.group_retry_policy),
        consume_message_orderly=cfg.consume_message_orderly,
        consume_broadcast_enable=cfg.consume_broadcast_enable,
        consume_timeout_minute=cfg.consume_timeout_minute,
        attributes=dict(cfg.attributes),
    )


def _policy_to_pb(policy: GroupRetryPolicy) -> pb.RetryPolicy:
    """The stored policy; a CUSTOMIZED one without a list has no delays (the level
    table), an EXPONENTIAL one without its numbers the defaults."""
    if policy.type is RetryPolicyType.EXPONENTIAL:
        exponential = policy.exponential or ExponentialRetryPolicy()
        return pb.RetryPolicy(
            type=pb.RetryPolicy.EXPONENTIAL,
            initial_ms=exponential.initial_ms,
            max_ms=exponential.max_ms,
            multiplier=exponential.multiplier,
        )
    customized = policy.customized
    return pb.RetryPolicy(
        type=pb.RetryPolicy.CUSTOMIZED,
        delays_ms=list(customized.next_ms) if customized is not None else [],
    )


def group_from_pb(
    msg: pb.GroupConfig, existing: SubscriptionGroupConfig | None = None
) -> SubscriptionGroupConfig:
    """A request's group config, checked field by field (BadRequest names the field).
    Fields the message does not carry keep ``existing``'s values (or RocketMQ's
    defaults)."""
    name = msg.group_name
    error = consumer_group_error(name) or group_topic_error(name)
    if error is not None:
        raise BadRequest(f"group.group_name: {error}")
    base = existing if existing is not None else SubscriptionGroupConfig(group_name=name)
    try:
        return dataclasses.replace(
            base,
            consume_enable=msg.consume_enable,
            retry_queue_nums=_retry_queue_nums(msg.retry_queue_nums),
            retry_max_times=_retry_max_times(msg.retry_max_times),
            group_retry_policy=_policy_from_pb(msg.retry_policy),
            consume_message_orderly=msg.consume_message_orderly,
            consume_broadcast_enable=msg.consume_broadcast_enable,
            consume_timeout_minute=_consume_timeout_minute(msg.consume_timeout_minute),
            attributes=dict(msg.attributes),
        )
    except ConfigFormatError as exc:  # a bound the checks above missed: still the caller's
        raise BadRequest(f"group {quote(name)}: {exc}") from exc


def _retry_queue_nums(value: int) -> int:
    value = value or DEFAULT_RETRY_QUEUE_NUMS
    if not 1 <= value <= MAX_RETRY_QUEUE_NUMS:
        raise BadRequest(
            f"group.retry_queue_nums is {value}; it must be 1..{MAX_RETRY_QUEUE_NUMS} "
            f"(0 means {DEFAULT_RETRY_QUEUE_NUMS})"
        )
    return value


def _retry_max_times(value: int) -> int:
    if value == _RETRY_MAX_TIMES_DEFAULT_MARK:
        return DEFAULT_RETRY_MAX_TIMES
    if not 0 <= value <= MAX_RETRY_MAX_TIMES:
        raise BadRequest(
            f"group.retry_max_times is {value}; it must be 0..{MAX_RETRY_MAX_TIMES} "
            f"(-1 means the default {DEFAULT_RETRY_MAX_TIMES}; 0 dead-letters at the first "
            "failure)"
        )
    return value


def _consume_timeout_minute(value: int) -> int:
    value = value or DEFAULT_CONSUME_TIMEOUT_MINUTE
    if not 1 <= value <= MAX_CONSUME_TIMEOUT_MINUTE:
        raise BadRequest(
            f"group.consume_timeout_minute is {value}; it must be "
            f"1..{MAX_CONSUME_TIMEOUT_MINUTE} (0 means {DEFAULT_CONSUME_TIMEOUT_MINUTE})"
        )
    return value


def _policy_from_pb(msg: pb.RetryPolicy) -> GroupRetryPolicy:
    kind = _POLICY_TYPES.get(msg.type)
    if kind is None:
        raise BadRequest(f"group.retry_policy.type is {msg.type}; it must be 0 (CUSTOMIZED) or 1")
    if kind is RetryPolicyType.EXPONENTIAL:
        if msg.delays_ms:
            raise BadRequest(
                "group.retry_policy.delays_ms is for a CUSTOMIZED policy; an EXPONENTIAL one "
                "takes initial_ms, max_ms and multiplier"
            )
        return GroupRetryPolicy(type=kind, exponential=_exponential(msg))
    if msg.initial_ms or msg.max_ms or msg.multiplier:
        raise BadRequest(
            "group.retry_policy: initial_ms, max_ms and multiplier are for an EXPONENTIAL "
            "policy; a CUSTOMIZED one takes delays_ms"
        )
    if not msg.delays_ms:
        return GroupRetryPolicy(type=kind)  # the delay level table (RocketMQ 4's levels)
    if len(msg.delays_ms) > MAX_CUSTOM_RETRY_DELAYS:
        raise BadRequest(
            f"group.retry_policy.delays_ms has {len(msg.delays_ms)} delays; at most "
            f"{MAX_CUSTOM_RETRY_DELAYS} (RETRY_DELAYS_MAX_COUNT)"
        )
    for index, delay_ms in enumerate(msg.delays_ms):
        _check_retry_delay(f"group.retry_policy.delays_ms[{index}]", delay_ms)
    return GroupRetryPolicy(type=kind, customized=CustomizedRetryPolicy(tuple(msg.delays_ms)))


def _exponential(msg: pb.RetryPolicy) -> ExponentialRetryPolicy:
    initial_ms = msg.initial_ms or DEFAULT_EXPONENTIAL_INITIAL_MS
    max_ms = msg.max_ms or DEFAULT_EXPONENTIAL_MAX_MS
    multiplier = msg.multiplier or DEFAULT_EXPONENTIAL_MULTIPLIER
    _check_retry_delay("group.retry_policy.initial_ms", initial_ms)
    _check_retry_delay("group.retry_policy.max_ms", max_ms)
    if max_ms < initial_ms:
        raise BadRequest(
            f"group.retry_policy.max_ms ({max_ms}) is below initial_ms ({initial_ms}); "
            "raise max_ms or lower initial_ms"
        )
    if not 1 <= multiplier <= MAX_RETRY_MULTIPLIER:
        raise BadRequest(
            f"group.retry_policy.multiplier is {multiplier}; it must be "
            f"1..{MAX_RETRY_MULTIPLIER} (0 means {DEFAULT_EXPONENTIAL_MULTIPLIER})"
        )
    return ExponentialRetryPolicy(initial_ms, max_ms, multiplier)


def _check_retry_delay(field: str, delay_ms: int) -> None:
    if not 0 < delay_ms <= MAX_RETRY_DELAY_MS:
        raise BadRequest(
            f"{field} is {delay_ms}; a retry delay must be 1..{MAX_RETRY_DELAY_MS} ms "
            "(3 days, the timer's maximum delay)"
        )

"""Consumer group configs for :class:`tide.client.Admin` (docs/delivery.md, "Consumer
group configs"): building the ``GroupConfig`` a create or an update sends.

A create gives every field (the defaults for those not named); an update starts from the
group's current config (or the defaults) and changes only what is named. The gateway
and the storage check the values and say what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tide.client._errors import InvalidArgument
from tide.format import DEFAULT_RETRY_MAX_TIMES
from tide.v1 import storage_pb2

RETRY_POLICIES = {
    "customized": storage_pb2.RetryPolicy.CUSTOMIZED,
    "exponential": storage_pb2.RetryPolicy.EXPONENTIAL,
}


@dataclass(frozen=True, slots=True)
class GroupChanges:
    """The fields a create or an update names (None: not named)."""

    retry_max_times: int | None = None
    retry_policy: str | None = None  # "customized" or "exponential"
    retry_delays_ms: Sequence[int] | None = None
    retry_initial_ms: int | None = None
    retry_max_ms: int | None = None
    retry_multiplier: int | None = None
    retry_queue_nums: int | None = None
    consume_enable: bool | None = None
    consume_orderly: bool | None = None


def default_config(group: str) -> storage_pb2.GroupConfig:
    """What a group without a config has (the storage's defaults)."""
    return storage_pb2.GroupConfig(
        group_name=group,
        consume_enable=True,
        consume_broadcast_enable=True,
        retry_queue_nums=1,
        retry_max_times=DEFAULT_RETRY_MAX_TIMES,
        retry_policy=storage_pb2.RetryPolicy(type=storage_pb2.RetryPolicy.CUSTOMIZED),
        consume_timeout_minute=15,
    )


def apply_changes(base: storage_pb2.GroupConfig, changes: GroupChanges) -> storage_pb2.GroupConfig:
    """``base`` with ``changes`` (a copy). Choosing a policy type clears the other
    type's numbers; giving a list or exponential numbers chooses their type."""
    config = storage_pb2.GroupConfig()
    config.CopyFrom(base)
    if changes.retry_max_times is not None:
        config.retry_max_times = changes.retry_max_times
    if changes.retry_queue_nums is not None:
        config.retry_queue_nums = changes.retry_queue_nums
    if changes.consume_enable is not None:
        config.consume_enable = changes.consume_enable
    if changes.consume_orderly is not None:
        config.consume_message_orderly = changes.consume_orderly
    _apply_policy(config.retry_policy, changes)
    return config


def _apply_policy(policy: storage_pb2.RetryPolicy, changes: GroupChanges) -> None:
    exponential_numbers = (changes.retry_initial_ms, changes.retry_max_ms, changes.retry_multiplier)
    kind = changes.retry_policy
    if kind is None and changes.retry_delays_ms is not None:
        kind = "customized"
    if kind is None and any(n is not None for n in exponential_numbers):
        kind = "exponential"
    if kind is not None:
        if kind not in RETRY_POLICIES:
            raise InvalidArgument(
                f"retry_policy is {kind!r}; give one of {', '.join(sorted(RETRY_POLICIES))}"
            )
        if RETRY_POLICIES[kind] != policy.type:
            policy.Clear()
            policy.type = RETRY_POLICIES[kind]
    customized = policy.type == storage_pb2.RetryPolicy.CUSTOMIZED
    if changes.retry_delays_ms is not None:
        if not customized:
            raise InvalidArgument("retry delays are for a customized policy, not exponential")
        policy.delays_ms[:] = list(changes.retry_delays_ms)
    if any(n is not None for n in exponential_numbers) and customized:
        raise InvalidArgument(
            "retry initial / max / multiplier are for an exponential policy, not customized"
        )
    if changes.retry_initial_ms is not None:
        policy.initial_ms = changes.retry_initial_ms
    if changes.retry_max_ms is not None:
        policy.max_ms = changes.retry_max_ms
    if changes.retry_multiplier is not None:
        policy.multiplier = changes.retry_multiplier

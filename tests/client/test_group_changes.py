"""tide.client._groups: what a create or an update of a group config sends."""

from __future__ import annotations

import pytest

from tide.client import InvalidArgument
from tide.client._groups import GroupChanges, apply_changes, default_config
from tide.v1 import storage_pb2

CUSTOMIZED = storage_pb2.RetryPolicy.CUSTOMIZED
EXPONENTIAL = storage_pb2.RetryPolicy.EXPONENTIAL


def test_defaults_are_the_storages() -> None:
    config = default_config("g")
    assert (config.retry_max_times, config.retry_queue_nums, config.consume_enable) == (16, 1, True)
    assert config.retry_policy == storage_pb2.RetryPolicy(type=CUSTOMIZED)


def test_only_named_fields_change_and_the_base_is_not_touched() -> None:
    base = default_config("g")
    changed = apply_changes(base, GroupChanges(retry_max_times=3, consume_enable=False))
    assert (changed.retry_max_times, changed.consume_enable, changed.retry_queue_nums) == (
        3,
        False,
        1,
    )
    assert base.retry_max_times == 16 and base.consume_enable


def test_a_list_or_exponential_numbers_choose_their_policy() -> None:
    listed = apply_changes(default_config("g"), GroupChanges(retry_delays_ms=[1000, 2000]))
    assert listed.retry_policy == storage_pb2.RetryPolicy(type=CUSTOMIZED, delays_ms=[1000, 2000])
    exponential = apply_changes(listed, GroupChanges(retry_max_ms=60_000))
    # The switch drops the list; the zeros are the storage's defaults.
    assert exponential.retry_policy == storage_pb2.RetryPolicy(type=EXPONENTIAL, max_ms=60_000)
    kept = apply_changes(exponential, GroupChanges(retry_multiplier=3))
    assert (kept.retry_policy.max_ms, kept.retry_policy.multiplier) == (60_000, 3)
    back = apply_changes(kept, GroupChanges(retry_policy="customized"))
    assert back.retry_policy == storage_pb2.RetryPolicy(type=CUSTOMIZED)


def test_conflicting_changes_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="for a customized policy"):
        apply_changes(
            default_config("g"), GroupChanges(retry_policy="exponential", retry_delays_ms=[1])
        )
    with pytest.raises(InvalidArgument, match="retry_policy is 'linear'"):
        apply_changes(default_config("g"), GroupChanges(retry_policy="linear"))

"""``tide group``'s duration arguments and policy text, without a cluster."""

from __future__ import annotations

import argparse

import pytest

from tide.cli._group import duration_ms, durations_ms, policy_text
from tide.v1 import storage_pb2


def test_durations() -> None:
    assert [duration_ms(t) for t in ("500ms", "10s", "5m", "2h", "1d")] == [
        500,
        10_000,
        300_000,
        7_200_000,
        86_400_000,
    ]
    assert durations_ms("10s,30s, 1m") == [10_000, 30_000, 60_000]
    for bad in ("", "10", "1w", "-1s", "1.5s", "s"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a duration"):
            duration_ms(bad)


def test_policy_text() -> None:
    customized = storage_pb2.RetryPolicy.CUSTOMIZED
    assert policy_text(storage_pb2.RetryPolicy(type=customized)).startswith(
        "customized (the delay levels"
    )
    listed = storage_pb2.RetryPolicy(type=customized, delays_ms=[1500, 60_000])
    assert policy_text(listed) == "customized 1500ms,1m"
    exponential = storage_pb2.RetryPolicy(
        type=storage_pb2.RetryPolicy.EXPONENTIAL, initial_ms=5000, max_ms=7_200_000, multiplier=2
    )
    assert policy_text(exponential) == "exponential 5s x2 up to 2h"

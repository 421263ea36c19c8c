"""Offset planning and options of tide.spark, without Spark or a cluster."""

from __future__ import annotations

import pytest

from tide.client import MessageQueue, QueueOffsets
from tide.spark._options import OptionError, ReadOptions
from tide.spark._planning import (
    PlanningError,
    QueueRange,
    cap_offsets,
    from_offsets_json,
    limit_offsets,
    merge_starts,
    parse_offset_spec,
    plan_ranges,
    resolve,
    to_offsets_json,
)

A0 = MessageQueue("T", "broker-a", 0)
A1 = MessageQueue("T", "broker-a", 1)
B0 = MessageQueue("T", "broker-b", 0)
U0 = MessageQueue("U", "broker-a", 0)
BOUNDS = {A0: QueueOffsets(0, 10), A1: QueueOffsets(5, 8), B0: QueueOffsets(0, 0)}


def test_offsets_json_round_trip_is_sorted() -> None:
    offsets = {B0: 3, A1: 2, U0: 7, A0: 1}
    data = to_offsets_json(offsets)
    assert data == {
        "T": {"broker-a/0": 1, "broker-a/1": 2, "broker-b/0": 3},
        "U": {"broker-a/0": 7},
    }
    assert list(data["T"]) == ["broker-a/0", "broker-a/1", "broker-b/0"]
    assert from_offsets_json(data) == offsets


def test_broker_names_with_slashes_split_on_the_last_one() -> None:
    assert from_offsets_json({"T": {"dc1/broker-a/3": 4}}) == {
        MessageQueue("T", "dc1/broker-a", 3): 4
    }


@pytest.mark.parametrize(
    "text",
    [
        '{"T": {"broker-a": 1}}',
        '{"T": {"broker-a/x": 1}}',
        '{"T": {"broker-a/0": "1"}}',
        "[1]",
        '{"T": 3}',
        "earliestt",
        '{"T": {"broker-a/0": -3}}',
    ],
)
def test_bad_offset_specs_are_rejected(text: str) -> None:
    with pytest.raises(PlanningError):
        parse_offset_spec(text, "startingOffsets")


def test_resolve_earliest_latest_and_json() -> None:
    assert resolve("earliest", BOUNDS, missing="latest") == {A0: 0, A1: 5, B0: 0}
    assert resolve("latest", BOUNDS, missing="earliest") == {A0: 10, A1: 8, B0: 0}
    spec = parse_offset_spec('{"T": {"broker-a/0": 4, "broker-a/1": -1}}', "x")
    # named ones as given (-1 latest), the rest per `missing`
    assert resolve(spec, BOUNDS, missing="earliest") == {A0: 4, A1: 8, B0: 0}
    # explicit offsets are clamped into [min, max]
    spec = parse_offset_spec('{"T": {"broker-a/0": 99, "broker-a/1": 1}}', "x")
    assert resolve(spec, BOUNDS, missing="latest") == {A0: 10, A1: 5, B0: 0}


def test_resolve_rejects_queues_not_in_the_route() -> None:
    spec = parse_offset_spec('{"T": {"broker-z/0": 1}}', "x")
    with pytest.raises(PlanningError, match="broker-z"):
        resolve(spec, BOUNDS, missing="earliest")


def test_plan_ranges_one_per_queue_and_split() -> None:
    starts, ends = {A0: 0, A1: 5, B0: 0}, {A0: 10, A1: 8, B0: 0}
    assert plan_ranges(starts, ends) == [QueueRange(A0, 0, 10), QueueRange(A1, 5, 8)]
    assert plan_ranges(starts, ends, 4) == [
        QueueRange(A0, 0, 4),
        QueueRange(A0, 4, 8),
        QueueRange(A0, 8, 10),
        QueueRange(A1, 5, 8),
    ]
    # a queue missing from the starts (new since) is read from 0
    assert plan_ranges({A0: 10}, {A0: 10, B0: 3}) == [QueueRange(B0, 0, 3)]
    with pytest.raises(PlanningError, match="before the start"):
        plan_ranges({A0: 5}, {A0: 4})
    with pytest.raises(PlanningError):
        plan_ranges(starts, ends, 0)


def test_limit_offsets_under_the_limit_takes_everything() -> None:
    assert limit_offsets({A0: 2, A1: 5}, {A0: 10, A1: 8, B0: 4}, 100) == {A0: 10, A1: 8, B0: 4}
    assert limit_offsets({A0: 2}, {A0: 10}, None) == {A0: 10}


def test_limit_offsets_shares_by_lag_and_always_progresses() -> None:
    ends = limit_offsets({A0: 0, A1: 0, B0: 0}, {A0: 90, A1: 10, B0: 0}, 10)
    assert ends == {A0: 9, A1: 1, B0: 0}
    ends = limit_offsets({A0: 0, A1: 0}, {A0: 1, A1: 1}, 1)
    assert sum(ends.values()) == 1
    # many small queues: the sum never exceeds the limit and is exactly the limit
    latest = {MessageQueue("T", "b", i): 3 for i in range(7)}
    ends = limit_offsets({}, latest, 5)
    assert sum(ends.values()) == 5
    assert all(0 <= v <= 3 for v in ends.values())


def test_limit_offsets_never_goes_backwards() -> None:
    # a queue whose max is below the start (truncated) keeps its start
    assert limit_offsets({A0: 7}, {A0: 5}, 10) == {A0: 7}


def test_available_now_caps_at_the_target() -> None:
    assert cap_offsets({A0: 12, A1: 3, B0: 4}, {A0: 10, A1: 8}) == {A0: 10, A1: 3}
    assert merge_starts({A0: 4}, [A0, B0]) == {A0: 4, B0: 0}


def test_read_options_defaults_and_checks() -> None:
    batch = ReadOptions.parse({"topic": "T, U,T"}, streaming=False)
    assert batch.topics == ("T", "U")
    assert batch.starting == "earliest" and batch.ending == "latest"
    stream = ReadOptions.parse(
        {"TOPIC": "T", "maxMessagesPerTrigger": "5", "startingOffsets": "earliest"},
        streaming=True,
    )
    assert stream.max_per_trigger == 5 and stream.starting == "earliest"
    assert ReadOptions.parse({"topic": "T"}, streaming=True).starting == "latest"
    for bad in (
        {},
        {"topic": "T", "maxMessagesPerPartition": "0"},
        {"topic": "T", "maxMessagesPerPartition": "x"},
        {"topic": "T", "startingOffsets": "earliest", "startingTimestamp": "5"},
        {"topic": "T", "pullBatchSize": "5000"},
        {"topic": "T", "failOnDataLoss": "maybe"},
    ):
        with pytest.raises(OptionError):
            ReadOptions.parse(bad, streaming=False)
    with pytest.raises(OptionError, match="batch reads only"):
        ReadOptions.parse({"topic": "T", "endingOffsets": "latest"}, streaming=True)

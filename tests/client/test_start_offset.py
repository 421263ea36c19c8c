from __future__ import annotations

import datetime as dt

import pytest

from tide.client import ConsumeFrom, InvalidArgument
from tide.client._start_offset import start_offset

T_MS = 1_700_000_000_000


def _no_search(ts: int) -> int:
    raise AssertionError(f"search({ts}) was not expected")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("last", ConsumeFrom("last")),
        ("first", ConsumeFrom("first")),
        (T_MS, ConsumeFrom("timestamp", T_MS)),
        (str(T_MS), ConsumeFrom("timestamp", T_MS)),
        ("2023-11-14T22:13:20Z", ConsumeFrom("timestamp", T_MS)),
        ("2023-11-14T22:13:20+00:00", ConsumeFrom("timestamp", T_MS)),
        ("2023-11-14T23:13:20+01:00", ConsumeFrom("timestamp", T_MS)),
        ("2023-11-14T22:13:20", ConsumeFrom("timestamp", T_MS)),  # naive is UTC
        (dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC), ConsumeFrom("timestamp", T_MS)),
    ],
)
def test_parse(value: str | int | dt.datetime, expected: ConsumeFrom) -> None:
    assert ConsumeFrom.parse(value) == expected


@pytest.mark.parametrize("value", ["", "latest", "yesterday", 1_700_000_000, "-5", True])
def test_parse_rejects(value: str | int) -> None:
    with pytest.raises(InvalidArgument):
        ConsumeFrom.parse(value)


def test_seconds_are_refused_with_a_hint() -> None:
    with pytest.raises(InvalidArgument, match="milliseconds"):
        ConsumeFrom.parse(1_700_000_000)


def test_committed_offset_wins() -> None:
    assert start_offset(7, ConsumeFrom("first"), 0, 10, _no_search) == 7
    assert start_offset(0, ConsumeFrom("last"), 0, 10, _no_search) == 0


def test_committed_offset_is_clamped_into_the_queue() -> None:
    # below min: those messages were deleted by retention
    assert start_offset(2, ConsumeFrom("first"), 5, 10, _no_search) == 5
    assert start_offset(20, ConsumeFrom("first"), 5, 10, _no_search) == 10


def test_no_committed_offset() -> None:
    assert start_offset(-1, ConsumeFrom("first"), 3, 10, _no_search) == 3
    assert start_offset(-1, ConsumeFrom("last"), 3, 10, _no_search) == 10
    searched: list[int] = []

    def search(ts: int) -> int:
        searched.append(ts)
        return 6

    assert start_offset(-1, ConsumeFrom("timestamp", T_MS), 3, 10, search) == 6
    assert searched == [T_MS]
    assert start_offset(-1, ConsumeFrom("timestamp", T_MS), 3, 10, lambda _: 99) == 10

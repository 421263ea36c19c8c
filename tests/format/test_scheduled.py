"""The property rewrites into and out of the schedule and timer topics."""

from __future__ import annotations

import pytest

from tide.format import (
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    delay_level_properties,
    encode_properties,
    real_destination,
    timer_due_now,
    timer_properties,
)

USER = {"UNIQ_KEY": "AC1100010000", "KEYS": "order-1", "TAGS": "TagA", "color": "red"}


def test_delay_level_properties_bytes_match_formats_md() -> None:
    """docs/formats.md, "System topics and properties": the level-3 example."""
    stored = delay_level_properties({}, "TopicTest", 1, 3)
    expected = b"DELAY\x013\x02REAL_TOPIC\x01TopicTest\x02REAL_QID\x011\x02"
    assert encode_properties(stored) == expected


def test_delay_level_properties_keep_user_properties_first() -> None:
    stored = delay_level_properties(USER, "TopicTest", 5, 2)
    assert list(stored) == [*USER, "DELAY", "REAL_TOPIC", "REAL_QID"]
    assert stored["DELAY"] == "2" and stored["REAL_QID"] == "5"
    assert USER == {"UNIQ_KEY": "AC1100010000", "KEYS": "order-1", "TAGS": "TagA", "color": "red"}


def test_delay_level_properties_replace_bookkeeping_the_input_carries() -> None:
    forged = {**USER, "REAL_TOPIC": "Elsewhere", "DELAY": "9", "TIMER_OUT_MS": "1"}
    stored = delay_level_properties(forged, "TopicTest", 0, 1)
    assert stored == {**USER, "DELAY": "1", "REAL_TOPIC": "TopicTest", "REAL_QID": "0"}


def test_delay_level_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="levels start at 1"):
        delay_level_properties({}, "TopicTest", 0, 0)


@pytest.mark.parametrize(
    ("deliver_at_ms", "precision_ms", "timer_out_ms"),
    [
        (1_700_000_090_500, 1000, 1_700_000_090_000),  # rounded down
        (1_700_000_090_000, 1000, 1_700_000_089_000),  # on a boundary: one period less
        (1_700_000_090_250, 100, 1_700_000_090_200),
        (1_700_000_090_200, 100, 1_700_000_090_100),
    ],
)
def test_timer_properties_file_under_the_slot_time(
    deliver_at_ms: int, precision_ms: int, timer_out_ms: int
) -> None:
    now_ms = 1_700_000_000_000
    stored = timer_properties(USER, "TopicTest", 3, deliver_at_ms, now_ms, precision_ms)
    assert stored == {
        **USER,
        "TIMER_DELIVER_MS": str(deliver_at_ms),
        "TIMER_OUT_MS": str(timer_out_ms),
        "REAL_TOPIC": "TopicTest",
        "REAL_QID": "3",
    }
    assert not timer_due_now(deliver_at_ms, now_ms)


@pytest.mark.parametrize("deliver_at_ms", [0, 1_699_999_999_999, 1_700_000_000_000])
def test_timer_properties_past_time_is_a_plain_message(deliver_at_ms: int) -> None:
    now_ms = 1_700_000_000_000
    forged = {**USER, "TIMER_DELIVER_MS": "5", "REAL_TOPIC": "x"}
    assert timer_properties(forged, "TopicTest", 3, deliver_at_ms, now_ms, 1000) == USER
    assert timer_due_now(deliver_at_ms, now_ms)


def test_timer_properties_bad_precision() -> None:
    with pytest.raises(ValueError, match="precision 300 ms"):
        timer_properties({}, "TopicTest", 0, 2_000, 1_000, 300)


def test_real_destination_of_a_delay_level_message() -> None:
    stored = {**USER, "RECONSUME_TIME": "2", **delay_level_properties({}, "TopicTest", 7, 4)}
    topic, queue_id, properties = real_destination(SCHEDULE_TOPIC, 3, stored)
    assert (topic, queue_id) == ("TopicTest", 7)
    assert properties == {**USER, "RECONSUME_TIME": "2"}


def test_real_destination_of_a_timed_message_drops_every_timer_property() -> None:
    stored = timer_properties(USER, "TopicTest", 2, 10_500, 1_000, 1000)
    stored |= {"TIMER_ENQUEUE_MS": "1", "TIMER_DEQUEUE_MS": "2", "TIMER_ROLL_TIMES": "1"}
    assert real_destination(TIMER_TOPIC, 0, stored) == ("TopicTest", 2, USER)


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({}, "has no REAL_TOPIC property"),
        ({"REAL_TOPIC": ""}, "has no REAL_TOPIC property"),
        ({"REAL_TOPIC": "T"}, "has REAL_QID ''; it must be a queue id"),
        ({"REAL_TOPIC": "T", "REAL_QID": "-1"}, "has REAL_QID '-1'"),
        ({"REAL_TOPIC": "T", "REAL_QID": "1x"}, "has REAL_QID '1x'"),
        ({"REAL_TOPIC": "T", "REAL_QID": "٣"}, "it must be a queue id"),
        ({"REAL_TOPIC": "T", "REAL_QID": "9" * 11}, "it must be a queue id"),
        ({"REAL_TOPIC": "T", "REAL_QID": "2147483648"}, "queue ids are at most 2147483647"),
    ],
)
def test_real_destination_refuses_what_cannot_be_delivered(
    properties: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        real_destination(SCHEDULE_TOPIC, 2, properties)
    assert "'SCHEDULE_TOPIC_XXXX' queue 2" in str(info.value)

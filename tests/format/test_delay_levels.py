"""messageDelayLevel parsing, the schedule topic's queues and its tags-code slot."""

from __future__ import annotations

import pytest

from tide.format import (
    DEFAULT_DELAY_LEVEL_TABLE,
    DEFAULT_DELAY_LEVELS,
    MAX_DELAY_LEVEL_MS,
    MAX_DELAY_LEVELS,
    MAX_DELAY_LEVELS_TEXT_CHARS,
    DelayLevelError,
    DelayLevelTable,
    correct_deliver_timestamp_ms,
    delay_level_of_queue,
    pack_entry,
    parse_delay_levels,
    parse_delay_property,
    retry_delay_level,
    schedule_queue_id,
    schedule_tags_code,
    unpack_entry,
)

S, M, H = 1000, 60_000, 3_600_000


def test_default_table_is_rocketmqs() -> None:
    assert DEFAULT_DELAY_LEVELS == "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    assert DEFAULT_DELAY_LEVEL_TABLE.delays_ms == (
        1 * S, 5 * S, 10 * S, 30 * S,
        1 * M, 2 * M, 3 * M, 4 * M, 5 * M, 6 * M, 7 * M, 8 * M, 9 * M, 10 * M, 20 * M, 30 * M,
        1 * H, 2 * H,
    )  # fmt: skip
    assert DEFAULT_DELAY_LEVEL_TABLE.max_level == 18
    assert DEFAULT_DELAY_LEVEL_TABLE.text() == DEFAULT_DELAY_LEVELS


def test_days_unit_and_round_trip() -> None:
    table = parse_delay_levels("90s 1d 7d")
    assert table.delays_ms == (90 * S, 86_400_000, 7 * 86_400_000)
    assert table.text() == "90s 1d 7d"
    assert parse_delay_levels(table.text()) == table


def test_whitespace_runs_are_one_separator() -> None:
    assert parse_delay_levels("  1s\t5s  \n10s ").delays_ms == (1 * S, 5 * S, 10 * S)


def test_level_to_delay() -> None:
    assert DEFAULT_DELAY_LEVEL_TABLE.delay_ms(1) == 1 * S
    assert DEFAULT_DELAY_LEVEL_TABLE.delay_ms(18) == 2 * H


@pytest.mark.parametrize("level", [0, -1, 19, 2**31])
def test_level_outside_the_table(level: int) -> None:
    error = DEFAULT_DELAY_LEVEL_TABLE.level_error(level)
    assert error is not None and "give 1 to 18" in error and DEFAULT_DELAY_LEVELS in error
    with pytest.raises(DelayLevelError, match="outside the delay level table"):
        DEFAULT_DELAY_LEVEL_TABLE.delay_ms(level)


def test_level_that_is_not_an_int() -> None:
    assert DEFAULT_DELAY_LEVEL_TABLE.level_error(True) is not None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("1s 5x", "delay level 2 is '5x'; write a count and a unit"),
        ("1s s", "delay level 2 is 's'"),
        ("1s -5s", "delay level 2 is '-5s'"),
        ("1s 1.5s", "delay level 2 is '1.5s'"),
        ("1S", "delay level 1 is '1S'"),
        ("0s", "delay level 1 is 0 ms"),
        ("8d", f"1 ms to {MAX_DELAY_LEVEL_MS} ms"),
        ("9999999999999999s", "write a count"),  # more than 15 digits
    ],
)
def test_bad_tables(text: str, says: str) -> None:
    with pytest.raises(DelayLevelError, match=None) as info:
        parse_delay_levels(text)
    assert says in str(info.value)


def test_too_many_levels() -> None:
    parse_delay_levels(" ".join(["1s"] * MAX_DELAY_LEVELS))
    with pytest.raises(DelayLevelError, match=f"the limit is {MAX_DELAY_LEVELS}"):
        parse_delay_levels(" ".join(["1s"] * (MAX_DELAY_LEVELS + 1)))


def test_bad_item_is_quoted_bounded() -> None:
    with pytest.raises(DelayLevelError) as info:
        parse_delay_levels("1s " + "x" * 1000)
    assert "..." in str(info.value) and len(str(info.value)) < 200


def test_text_too_long_is_refused_before_parsing() -> None:
    with pytest.raises(DelayLevelError, match=f"limit is {MAX_DELAY_LEVELS_TEXT_CHARS}"):
        parse_delay_levels("1s " * 2000)


def test_hand_built_table_is_checked() -> None:
    with pytest.raises(DelayLevelError, match="0 levels"):
        DelayLevelTable(())
    assert DelayLevelTable((1500,)).text() == "1500ms"


def test_schedule_queue_of_a_level() -> None:
    assert [schedule_queue_id(level) for level in (1, 3, 18)] == [0, 2, 17]
    assert [delay_level_of_queue(q) for q in (0, 2, 17)] == [1, 3, 18]


def test_worked_example_schedule_entry_is_byte_exact() -> None:
    """docs/formats.md, "Delay levels": level 3 stored at 2000 ms, record at 5000 of 160
    bytes: the entry's tags code is the delivery time 12000 ms (0x2EE0)."""
    deliver_ms = schedule_tags_code(DEFAULT_DELAY_LEVEL_TABLE, 3, 2_000)
    assert deliver_ms == 12_000
    data = pack_entry(5_000, 160, deliver_ms)
    assert data == bytes.fromhex("0000000000001388 000000A0 0000000000002EE0")
    assert unpack_entry(data).tags_code == 12_000


def test_level_above_the_table_is_clamped_in_the_tags_code() -> None:
    """CommitLog.checkMessageAndReturnSize clamps to the maximum level."""
    assert schedule_tags_code(DEFAULT_DELAY_LEVEL_TABLE, 40, 0) == 2 * H


@pytest.mark.parametrize(
    ("value", "level"),
    [("3", 3), ("18", 18), ("+3", 3), ("-1", -1), ("0", 0), ("x", None), ("", None),
     ("1.0", None), ("2147483648", None), (" 3", None)],
)  # fmt: skip
def test_delay_property(value: str, level: int | None) -> None:
    assert parse_delay_property(value) == level


def test_deliver_time_corrected_when_too_far() -> None:
    """A delivery time beyond now + the level's delay (the clock went back) is now."""
    table = DEFAULT_DELAY_LEVEL_TABLE
    assert correct_deliver_timestamp_ms(table, 3, 100_000, 110_000) == 110_000
    assert correct_deliver_timestamp_ms(table, 3, 100_000, 110_001) == 100_000
    assert correct_deliver_timestamp_ms(table, 3, 100_000, 50_000) == 50_000


def test_rocketmq4_retry_levels() -> None:
    """Send-back waits level 3 + reconsume times, clamped to the last level."""
    table = DEFAULT_DELAY_LEVEL_TABLE
    assert [retry_delay_level(table, r) for r in (0, 1, 14, 15, 16, 100)] == [
        3, 4, 17, 18, 18, 18,
    ]  # fmt: skip
    assert retry_delay_level(table, -5) == 3
    assert retry_delay_level(parse_delay_levels("1s 2s"), 0) == 2

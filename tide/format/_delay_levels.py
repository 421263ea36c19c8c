"""Delay levels: RocketMQ's ``messageDelayLevel`` table and the schedule topic's layout.

docs/formats.md, "Delay levels". A message produced with delay level *n* is stored in
``SCHEDULE_TOPIC_XXXX``, queue ``n - 1``, with its real topic and queue in ``REAL_TOPIC`` /
``REAL_QID`` and ``DELAY = "n"``; the consume queue entry's tags code holds the delivery
time, ``store_timestamp + delay(n)`` in ms (``CommitLog.checkMessageAndReturnSize``).

The table is a string of space-separated durations, a decimal count and a unit (``s``,
``m``, ``h``, ``d``), level 1 first: ``"1s 5s 10s 30s 1m ... 2h"``
(``ScheduleMessageService.parseDelayLevel``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
MAX_DELAY_LEVELS = 64
"""Most levels a table may have: each level is a queue of the schedule topic and a
delivery task of its own (RocketMQ runs one thread per level)."""
MAX_DELAY_LEVEL_MS = 7 * 24 * 3600 * 1000
"""Longest delay of one level (7 days, the timer wheel's span); RocketMQ sets no bound."""
MAX_DELAY_LEVELS_TEXT_CHARS = 4096
"""Longest ``messageDelayLevel`` string parsed (64 levels of well over 40 characters)."""
RETRY_FIRST_DELAY_LEVEL = 3
"""RocketMQ 4's send-back: attempt ``r`` (reconsume times) waits level ``3 + r``."""

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"([0-9]{1,15})([smhd])")
_SHOWN_CHARS = 40  # how much of bad input an error message repeats


class DelayLevelError(ValueError):
    """A ``messageDelayLevel`` string or a level that cannot be used; the text says why."""


@dataclass(frozen=True, slots=True)
class DelayLevelTable:
    """Delay of each level in ms: ``delays_ms[0]`` is level 1."""

    delays_ms: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.delays_ms) <= MAX_DELAY_LEVELS:
            raise DelayLevelError(
                f"a delay level table has {len(self.delays_ms)} levels; "
                f"it needs 1 to {MAX_DELAY_LEVELS}"
            )
        for level, delay_ms in enumerate(self.delays_ms, start=1):
            if not 0 < delay_ms <= MAX_DELAY_LEVEL_MS:
                raise DelayLevelError(
                    f"delay level {level} is {delay_ms} ms; a level's delay must be "
                    f"1 ms to {MAX_DELAY_LEVEL_MS} ms (7 days)"
                )

    @property
    def max_level(self) -> int:
        return len(self.delays_ms)

    def delay_ms(self, level: int) -> int:
        """The delay of ``level`` (1-based); DelayLevelError outside the table."""
        error = self.level_error(level)
        if error is not None:
            raise DelayLevelError(error)
        return self.delays_ms[level - 1]

    def level_error(self, level: int) -> str | None:
        """Why ``level`` is not a level of this table, or None when it is."""
        if type(level) is not int or not 1 <= level <= self.max_level:
            return (
                f"delay_level {str(level)[:_SHOWN_CHARS]} is outside the delay level table; "
                f"give 1 to {self.max_level} (messageDelayLevel: {self.text()})"
            )
        return None

    def text(self) -> str:
        """The table as ``messageDelayLevel`` text, each delay in its largest whole unit."""
        return " ".join(_duration_text(ms) for ms in self.delays_ms)


def parse_delay_levels(text: str) -> DelayLevelTable:
    """Parse a ``messageDelayLevel`` string; DelayLevelError says what to fix.

    Durations are separated by whitespace (RocketMQ splits on single spaces; runs of
    spaces and tabs are accepted here). Counts are decimal digits, at least 1.
    """
    if len(text) > MAX_DELAY_LEVELS_TEXT_CHARS:
        raise DelayLevelError(
            f"messageDelayLevel is {len(text)} characters; the limit is "
            f"{MAX_DELAY_LEVELS_TEXT_CHARS}"
        )
    items = text.split()
    if not items:
        raise DelayLevelError(
            f"messageDelayLevel is empty; give durations such as {DEFAULT_DELAY_LEVELS!r}"
        )
    if len(items) > MAX_DELAY_LEVELS:
        raise DelayLevelError(
            f"messageDelayLevel has {len(items)} levels; the limit is {MAX_DELAY_LEVELS}"
        )
    delays_ms = (_parse_duration(level, item) for level, item in enumerate(items, start=1))
    return DelayLevelTable(tuple(delays_ms))


def _parse_duration(level: int, item: str) -> int:
    match = _DURATION.fullmatch(item)
    if match is None:
        shown = item if len(item) <= _SHOWN_CHARS else item[:_SHOWN_CHARS] + "..."
        raise DelayLevelError(
            f"delay level {level} is {shown!r}; write a count and a unit: s, m, h or d "
            "(for example 30s, 5m, 2h)"
        )
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def _duration_text(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"  # not expressible in whole seconds: only from a hand-built table


DEFAULT_DELAY_LEVEL_TABLE = parse_delay_levels(DEFAULT_DELAY_LEVELS)


def schedule_queue_id(level: int) -> int:
    """``ScheduleMessageService.delayLevel2QueueId``: level ``n`` lives in queue ``n - 1``."""
    return level - 1


def delay_level_of_queue(queue_id: int) -> int:
    """``ScheduleMessageService.queueId2DelayLevel``."""
    return queue_id + 1


def parse_delay_property(value: str) -> int | None:
    """The level in a ``DELAY`` property, or None when it is not a decimal int.

    RocketMQ's dispatch parses it with ``Integer.parseInt``; levels above the table's
    maximum are then clamped to it (:func:`schedule_tags_code`).
    """
    if not re.fullmatch(r"[+-]?[0-9]{1,10}", value):
        return None
    level = int(value)
    return level if -(2**31) <= level < 2**31 else None


def schedule_tags_code(table: DelayLevelTable, level: int, store_timestamp_ms: int) -> int:
    """The tags code of a schedule-topic entry: its delivery time in ms.

    ``CommitLog.checkMessageAndReturnSize`` clamps a level above the maximum to the
    maximum; a level of 0 or less is no delay, and the record keeps its ordinary tags
    code (the caller's to compute).
    """
    assert level > 0, level
    return store_timestamp_ms + table.delays_ms[min(level, table.max_level) - 1]


def correct_deliver_timestamp_ms(
    table: DelayLevelTable, level: int, now_ms: int, deliver_ms: int
) -> int:
    """``DeliverDelayedMessageTimerTask.correctDeliverTimestamp``: a delivery time further
    than one level's delay from now (the clock went back, or the entry is bad) is now."""
    return now_ms if deliver_ms > now_ms + table.delay_ms(level) else deliver_ms


def retry_delay_level(table: DelayLevelTable, reconsume_times: int) -> int:
    """RocketMQ 4's send-back level: ``3 + reconsume_times``, clamped to the table
    (``AbstractSendMessageProcessor`` then ``HookUtils.transformDelayLevelMessage``)."""
    return min(RETRY_FIRST_DELAY_LEVEL + max(reconsume_times, 0), table.max_level)

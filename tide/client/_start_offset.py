"""Where a consumer starts in a queue its group has no committed offset for."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tide.client._errors import InvalidArgument

# A 13-digit number is ms since epoch; smaller numbers would be 1970 and are most likely a
# mistake (seconds), so they are refused.
MIN_TIMESTAMP_MS = 10**12


@dataclass(frozen=True)
class ConsumeFrom:
    """``last`` (only new messages), ``first`` (the oldest stored), or ``timestamp_ms``."""

    kind: Literal["first", "last", "timestamp"]
    timestamp_ms: int = 0

    @classmethod
    def parse(cls, value: str | int | dt.datetime | ConsumeFrom) -> ConsumeFrom:
        """ "last", "first", ms since epoch (int or digits), an ISO-8601 time or a datetime
        (naive means UTC)."""
        if isinstance(value, ConsumeFrom):
            return value
        if isinstance(value, dt.datetime):
            return cls("timestamp", _datetime_ms(value))
        if isinstance(value, int) and not isinstance(value, bool):
            return cls("timestamp", _checked_ms(value))
        if isinstance(value, str):
            text = value.strip()
            if text in ("first", "last"):
                return cls(text)  # type: ignore[arg-type]
            if text.isdigit():
                return cls("timestamp", _checked_ms(int(text)))
            try:
                parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                pass
            else:
                return cls("timestamp", _datetime_ms(parsed))
        raise InvalidArgument(
            f"consume_from {value!r}: give 'first', 'last', ms since epoch or an ISO-8601 time"
        )


def _checked_ms(value: int) -> int:
    if value < MIN_TIMESTAMP_MS:
        raise InvalidArgument(
            f"timestamp {value} is before 2001-09-09; give milliseconds since epoch"
        )
    return value


def _datetime_ms(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int(value.timestamp() * 1000)


def start_offset(
    committed: int,
    consume_from: ConsumeFrom,
    min_offset: int,
    max_offset: int,
    search: Callable[[int], int],
) -> int:
    """The first offset to pull: the committed one (clamped into [min, max], as messages
    below min are gone) or, with none (-1), what ``consume_from`` says. ``search`` maps a
    timestamp to the first offset stored at or after it."""
    if committed >= 0:
        return min(max(committed, min_offset), max_offset)
    if consume_from.kind == "first":
        return min_offset
    if consume_from.kind == "last":
        return max_offset
    return min(max(search(consume_from.timestamp_ms), min_offset), max_offset)

"""``tide produce``'s delay options: --delay-level N, --deliver-at TIME, --delay DURATION."""

from __future__ import annotations

import argparse
import re
from datetime import datetime

from tide.quoting import quote

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"([0-9]{1,15})(ms|s|m|h|d)")
DELIVER_AT_FORMS = (
    "milliseconds since the epoch (1767225600000), or an ISO-8601 time "
    "(2026-01-01T00:00:00Z, 2026-01-01 09:30:00+02:00; without an offset: local time)"
)
DELAY_FORMS = "a count and a unit: ms, s, m, h or d (500ms, 30s, 5m, 2h, 1d)"


def delay_level(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 2**31 - 1:
        raise argparse.ArgumentTypeError(
            f"{quote(text)} is not a delay level; give 1.. the broker's table size (18 by default)"
        )
    return int(text)


def deliver_at_ms(text: str) -> int:
    """Milliseconds since the epoch, from ``text`` in one of :data:`DELIVER_AT_FORMS`."""
    if text.isdigit() and len(text) <= 18:
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{quote(text)} is not a time; give {DELIVER_AT_FORMS}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time
    millis = int(moment.timestamp() * 1000)
    if millis <= 0:
        raise argparse.ArgumentTypeError(f"{quote(text)} is before 1970; give a later time")
    return millis


def delay_ms(text: str) -> int:
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a delay; give {DELAY_FORMS}")
    millis = int(match.group(1)) * _UNIT_MS[match.group(2)]
    if millis <= 0:
        raise argparse.ArgumentTypeError(f"{quote(text)} is no delay; give more than 0")
    return millis


def add_delay_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--delay-level",
        type=delay_level,
        default=0,
        metavar="N",
        help="deliver at delay level N of the broker's table (1s 5s 10s 30s 1m ... 2h)",
    )
    group.add_argument(
        "--deliver-at",
        type=deliver_at_ms,
        default=0,
        metavar="TIME",
        help="deliver at TIME: ms since the epoch or ISO-8601 (a past time: now)",
    )
    group.add_argument(
        "--delay",
        type=delay_ms,
        default=0,
        metavar="DURATION",
        help="deliver after DURATION (500ms, 30s, 5m, 2h, 1d)",
    )

"""Times on the pages: UTC text for ms since epoch, and datetime-local form values (read
as UTC) to ms."""

from __future__ import annotations

from datetime import UTC, datetime

from starlette.exceptions import HTTPException

from services.console.pages._util import quoted


def utc_text(ms: int) -> str:
    """``2026-11-27 17:05:00.123 UTC``; "" for 0 (not recorded)."""
    if ms <= 0:
        return ""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d} UTC"


def form_ms(value: str, name: str) -> int:
    """A ``datetime-local`` value (YYYY-MM-DDTHH:MM[:SS], UTC) as ms; 0 when empty."""
    value = value.strip()
    if not value:
        return 0
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise HTTPException(
            400, f"{name} {quoted(value)} is not a time: give YYYY-MM-DDTHH:MM (UTC)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)

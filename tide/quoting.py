"""How an error message repeats input: cut short, with its full length said.

A status message travels in gRPC metadata (8 KiB by default): one that repeats a
100 kB value whole never reaches the client, which sees only "Stream removed". Every
error message that quotes input goes through :func:`quote` (a list: :func:`quote_all`).
"""

from __future__ import annotations

from collections.abc import Sequence

# How much of a value an error message repeats.
QUOTE_MAX_CHARS = 64


def quote(value: str | bytes, max_chars: int = QUOTE_MAX_CHARS) -> str:
    """``value``'s repr; when it is longer than ``max_chars``, the repr of its first
    ``max_chars`` characters (or bytes) followed by its full length."""
    if len(value) <= max_chars:
        return repr(value)
    unit = "bytes" if isinstance(value, bytes | bytearray) else "characters"
    return f"{value[:max_chars]!r}... ({len(value)} {unit})"


# How many values of a list an error message repeats.
QUOTE_MAX_ITEMS = 5


def quote_all(values: Sequence[str], max_items: int = QUOTE_MAX_ITEMS) -> str:
    """Each of the first ``max_items`` values quoted, comma separated, and how many more."""
    shown = ", ".join(quote(value) for value in values[:max_items])
    more = len(values) - max_items
    return f"{shown} and {more} more" if more > 0 else shown

"""Wait on observable state: poll a predicate until it holds or a deadline passes.

The one polling loop of the project's waits (the tests', ``tide up``'s and the
benchmarks' ready files through :mod:`tide.spawn`): a wait names what it waits for, so
that a timeout says what did not happen, and never sleeps a fixed time hoping the state
is there by then. Polls back off from 1 ms to ``interval_s``, so a quick state is seen
quickly and a slow one (an RPC or a scrape per poll) costs little.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_INTERVAL_S = 0.02
FIRST_INTERVAL_S = 0.001


class WaitTimeout(TimeoutError):
    """The predicate did not hold within the timeout; the message says what was awaited."""


def _timed_out(what: str, timeout_s: float, state: Callable[[], object] | None) -> WaitTimeout:
    seen = "" if state is None else f"; last seen: {state()}"
    return WaitTimeout(f"timed out after {timeout_s:.3g} s waiting for {what}{seen}")


def wait_until(
    predicate: Callable[[], object],
    what: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    state: Callable[[], object] | None = None,
) -> None:
    """Return once ``predicate()`` is truthy; raise :class:`WaitTimeout` naming ``what``
    (and ``state()``, when given, to show what was there instead) after ``timeout_s``.
    Exceptions from the predicate propagate (a process that died is not worth waiting
    for)."""
    deadline = time.monotonic() + timeout_s
    delay = min(FIRST_INTERVAL_S, interval_s)
    while not predicate():
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, state)
        time.sleep(delay)
        delay = min(delay * 2, interval_s)


async def wait_until_async(
    predicate: Callable[[], object | Awaitable[object]],
    what: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    state: Callable[[], object] | None = None,
) -> None:
    """:func:`wait_until` for a coroutine: the event loop runs meanwhile; ``predicate``
    may return an awaitable."""
    deadline = time.monotonic() + timeout_s
    delay = min(FIRST_INTERVAL_S, interval_s)
    while True:
        result = predicate()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, state)
        await asyncio.sleep(delay)
        delay = min(delay * 2, interval_s)

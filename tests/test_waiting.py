"""tide.waiting: the one poll-until-a-deadline loop of the tests, tide up and the benches."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from tide.waiting import WaitTimeout, wait_until, wait_until_async


def test_returns_once_the_predicate_holds() -> None:
    calls = itertools.count(1)
    wait_until(lambda: next(calls) >= 5, "the fifth call", 10.0)
    assert next(calls) == 6  # polled exactly until it held


def test_timeout_names_what_was_awaited_and_what_was_seen() -> None:
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as raised:
        wait_until(lambda: False, "the moon", 0.1, state=lambda: "no moon")
    assert time.monotonic() - started >= 0.1
    assert str(raised.value) == "timed out after 0.1 s waiting for the moon; last seen: no moon"
    assert isinstance(raised.value, TimeoutError)


def test_an_error_in_the_predicate_ends_the_wait() -> None:
    def broken() -> bool:
        raise ProcessLookupError("gone")

    with pytest.raises(ProcessLookupError, match="gone"):
        wait_until(broken, "never", 10.0)


def test_async_wait_takes_plain_and_awaitable_predicates() -> None:
    async def main() -> None:
        event = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, event.set)
        await wait_until_async(event.is_set, "the event", 10.0)

        async def never() -> bool:
            return False

        with pytest.raises(WaitTimeout, match="waiting for nothing"):
            await wait_until_async(never, "nothing", 0.05)

    asyncio.run(main())

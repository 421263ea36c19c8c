"""The request-stream pools' deadlines (services/gateway/deadlines.py): one timer per
timeout value cancels the calls whose deadlines passed, and only those; a call's own
cancellation is told apart from its deadline's; nothing is kept once calls end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import uvloop

from services.gateway.deadlines import Deadlines

SHORT_S = 0.05  # a deadline that passes while the call waits on a future never set
LONG_S = 600.0  # one that never passes in a test


async def _call(deadlines: Deadlines, timeout_s: float, work: Awaitable[object]) -> str:
    """A call as RequestStreamPool.call makes one: 'done', 'timed out' or raises."""
    deadline = deadlines.start(timeout_s)
    try:
        await work
        return "done"
    except asyncio.CancelledError:
        if deadline.timed_out():
            return "timed out"
        raise
    finally:
        deadline.end()


Runner = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    """Run a test's coroutine on the stock loop or on uvloop (the services')."""
    start = asyncio.run if request.param == "asyncio" else uvloop.run

    def runner(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
        start(test())

    return runner


def test_only_the_calls_past_their_deadline_are_cancelled(run: Runner) -> None:
    async def test() -> None:
        deadlines = Deadlines()
        loop = asyncio.get_running_loop()
        stuck = loop.create_future()  # never set: a storage that never answers
        answered = loop.create_future()
        calls = [
            asyncio.create_task(_call(deadlines, SHORT_S, stuck)),
            asyncio.create_task(_call(deadlines, LONG_S, answered)),
            asyncio.create_task(_call(deadlines, SHORT_S, asyncio.sleep(0))),
        ]
        assert await calls[0] == "timed out"
        assert await calls[2] == "done"
        assert not calls[1].done()
        answered.set_result(None)
        assert await calls[1] == "done"

    run(test)


def test_calls_ending_in_any_order_keep_only_the_pending_ones(run: Runner) -> None:
    async def test() -> None:
        deadlines = Deadlines()
        loop = asyncio.get_running_loop()
        answers = [loop.create_future() for _ in range(100)]
        calls = [asyncio.create_task(_call(deadlines, LONG_S, answer)) for answer in answers]
        await asyncio.sleep(0)  # every call started
        (queue,) = deadlines._queues.values()
        for answer in answers[1:]:  # all but the oldest: they stay behind it
            answer.set_result(None)
        await asyncio.gather(*calls[1:])
        assert len(queue._entries) == 100
        answers[0].set_result(None)  # the oldest ends: the ended ones behind it go too
        assert await calls[0] == "done"
        assert len(queue._entries) == 0

    run(test)


def test_the_queue_goes_once_its_timer_finds_nothing_pending(run: Runner) -> None:
    async def test() -> None:
        deadlines = Deadlines()
        assert await _call(deadlines, SHORT_S, asyncio.sleep(0)) == "done"
        assert len(deadlines) == 1  # its timer is still armed for the ended call
        while len(deadlines):  # the timer fires at the deadline and finds none pending
            await asyncio.sleep(SHORT_S / 5)
        # A later call starts a queue of its own and still times out.
        stuck = asyncio.get_running_loop().create_future()
        assert await _call(deadlines, SHORT_S, stuck) == "timed out"

    run(test)


def test_a_timer_re_arms_for_a_later_pending_deadline(run: Runner) -> None:
    """The timer armed for an ended call's deadline fires before the next call's: that
    call is not cancelled early, and times out at its own deadline."""

    async def test() -> None:
        deadlines = Deadlines()
        loop = asyncio.get_running_loop()
        first = loop.create_future()
        early = asyncio.create_task(_call(deadlines, 4 * SHORT_S, first))
        await asyncio.sleep(0)
        # The next call starts later, so its deadline is after the one the timer is armed
        # for (uvloop's clock is cached per iteration: without the wait both are equal).
        await asyncio.sleep(SHORT_S)
        started = loop.time()
        later = asyncio.create_task(_call(deadlines, 4 * SHORT_S, loop.create_future()))
        first.set_result(None)
        assert await early == "done"
        assert await later == "timed out"
        # Compared as the deadline is computed (a sum in the loop's clock), not as a
        # difference: `now - started` can round below the timeout when `now` is exactly
        # the deadline, which is what failed once under uvloop's millisecond clock.
        assert loop.time() >= started + 4 * SHORT_S

    run(test)


def test_a_cancelled_call_stays_cancelled(run: Runner) -> None:
    """Cancelled from outside before its deadline, or at the same time as it passes: the
    call is cancelled, not timed out."""

    async def test() -> None:
        deadlines = Deadlines()
        loop = asyncio.get_running_loop()
        call = asyncio.create_task(_call(deadlines, LONG_S, loop.create_future()))
        await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

        both = asyncio.create_task(_call(deadlines, SHORT_S, loop.create_future()))
        await asyncio.sleep(0)
        passed = loop.time() + SHORT_S
        while loop.time() <= passed:  # the loop held until the deadline has passed...
            time.sleep(SHORT_S / 5)
        both.cancel()  # ...so that it fires in the turn the caller goes away in
        with pytest.raises(asyncio.CancelledError):
            await both

    run(test)


def test_a_deadline_ended_does_not_cancel_its_task_later(run: Runner) -> None:
    async def test() -> None:
        deadlines = Deadlines()
        assert await _call(deadlines, SHORT_S, asyncio.sleep(0)) == "done"
        while len(deadlines):  # past the deadline, the task still waiting on its own
            await asyncio.sleep(SHORT_S / 5)
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

    run(test)


def test_deadlines_outlive_their_loop(run: Runner) -> None:
    """A pool's deadlines used from a second loop (the first closed with its timer
    armed): the calls there still time out."""
    deadlines = Deadlines()

    async def first() -> None:  # leaves its queue's timer armed on a loop that closes
        assert await _call(deadlines, SHORT_S, asyncio.sleep(0)) == "done"

    async def second() -> None:
        stuck = asyncio.get_running_loop().create_future()
        async with asyncio.timeout(LONG_S / 60):  # a bound: the bug this finds hangs
            assert await _call(deadlines, SHORT_S, stuck) == "timed out"
        assert await _call(deadlines, SHORT_S, asyncio.sleep(0)) == "done"

    run(first)
    run(second)
    run(second)

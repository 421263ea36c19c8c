"""ArrivalHub: notices coalesced per queue for watchers that read slowly."""

from __future__ import annotations

import asyncio
import contextlib

from services.dispatch.arrivals import ArrivalHub
from services.dispatch.engine.dispatch_store import Arrival


def run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 10))  # type: ignore[arg-type]


def test_a_slow_watcher_gets_the_latest_max_per_queue_once() -> None:
    async def scenario() -> None:
        hub = ArrivalHub()
        watch = hub.watch(["t"])
        task = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0)  # the watcher is registered and waiting
        assert hub.watcher_count == 1
        for top in range(1, 1001):
            hub.publish([Arrival("t", 0, top), Arrival("t", 1, top * 2), Arrival("x", 0, top)])
        assert await task == {("t", 0): 1000, ("t", 1): 2000}
        hub.publish([Arrival("t", 0, 999)])  # never backwards
        hub.publish([Arrival("t", 0, 1001)])
        assert await anext(watch) == {("t", 0): 1001}
        await watch.aclose()
        assert hub.watcher_count == 0

    run(scenario())


def test_current_state_comes_first_and_close_ends_every_watch() -> None:
    async def scenario() -> None:
        hub = ArrivalHub()
        watch = hub.watch([], current=[Arrival("a", 0, 5), Arrival("b", 3, 7)])
        assert await anext(watch) == {("a", 0): 5, ("b", 3): 7}
        waiting = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0)
        hub.close()
        with contextlib.suppress(StopAsyncIteration):
            await waiting
            raise AssertionError("the watch did not end")
        later = hub.watch([])
        with contextlib.suppress(StopAsyncIteration):
            await anext(later)
            raise AssertionError("a watch after close did not end")

    run(scenario())

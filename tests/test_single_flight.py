"""tide.single_flight: concurrent callers of one key share one fetch."""

from __future__ import annotations

import asyncio

import pytest

from tide.single_flight import SingleFlight


class Fetcher:
    """A fetch that runs until ``release`` is set, counting its starts."""

    def __init__(self, answer: str = "answer", error: Exception | None = None) -> None:
        self.started = 0
        self.finished = 0
        self.release = asyncio.Event()
        self._answer = answer
        self._error = error

    async def fetch(self) -> str:
        self.started += 1
        await self.release.wait()
        if self._error is not None:
            raise self._error
        self.finished += 1
        return self._answer


async def _until_waiting(flight: SingleFlight[str, str], tasks: list[asyncio.Task[str]]) -> None:
    """Every caller task has reached its await of the shared fetch (no sleep on time:
    a task that has not run yet is not 'waiting')."""
    for _ in range(100):  # each round lets every ready task run one step
        if len(flight) == 1 and all(not task.done() for task in tasks):
            await asyncio.sleep(0)
            return
        await asyncio.sleep(0)
    raise AssertionError("the callers never waited for the fetch")


def test_concurrent_callers_of_one_key_share_one_fetch() -> None:
    async def main() -> None:
        flight: SingleFlight[str, str] = SingleFlight("test")
        fetcher = Fetcher()
        other = Fetcher("other")
        callers = [asyncio.create_task(flight.run("k", fetcher.fetch)) for _ in range(5)]
        callers.append(asyncio.create_task(flight.run("j", other.fetch)))
        await asyncio.sleep(0)
        assert len(flight) == 2
        fetcher.release.set()
        other.release.set()
        answers = await asyncio.gather(*callers)
        assert answers == ["answer"] * 5 + ["other"]
        assert (fetcher.started, other.started) == (1, 1)
        assert len(flight) == 0
        # Done: the next call fetches again (the helper keeps no answers).
        assert await flight.run("k", fetcher.fetch) == "answer"
        assert fetcher.started == 2

    asyncio.run(main())


def test_a_failed_fetch_reaches_every_waiter_and_is_not_kept() -> None:
    async def main() -> None:
        flight: SingleFlight[str, str] = SingleFlight("test")
        failing = Fetcher(error=RuntimeError("name server down"))
        callers = [asyncio.create_task(flight.run("k", failing.fetch)) for _ in range(3)]
        await _until_waiting(flight, callers)
        failing.release.set()
        results = await asyncio.gather(*callers, return_exceptions=True)
        assert [str(result) for result in results] == ["name server down"] * 3
        assert all(isinstance(result, RuntimeError) for result in results)
        assert failing.started == 1 and len(flight) == 0
        working = Fetcher()
        working.release.set()
        assert await flight.run("k", working.fetch) == "answer"  # a new fetch
        assert working.started == 1

    asyncio.run(main())


def test_a_cancelled_caller_does_not_cancel_the_fetch_for_the_others() -> None:
    async def main() -> None:
        flight: SingleFlight[str, str] = SingleFlight("test")
        fetcher = Fetcher()
        first = asyncio.create_task(flight.run("k", fetcher.fetch))  # started the fetch
        second = asyncio.create_task(flight.run("k", fetcher.fetch))
        await _until_waiting(flight, [first, second])
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        fetcher.release.set()
        assert await second == "answer"
        assert (fetcher.started, fetcher.finished) == (1, 1)

    asyncio.run(main())


def test_the_fetch_completes_when_every_caller_has_gone() -> None:
    async def main() -> None:
        flight: SingleFlight[str, str] = SingleFlight("test")
        fetcher = Fetcher()
        only = asyncio.create_task(flight.run("k", fetcher.fetch))
        await _until_waiting(flight, [only])
        only.cancel()
        with pytest.raises(asyncio.CancelledError):
            await only
        assert len(flight) == 1  # still running, for the cache it fills
        fetcher.release.set()
        for _ in range(100):
            if len(flight) == 0:
                break
            await asyncio.sleep(0)
        assert fetcher.finished == 1 and len(flight) == 0

    asyncio.run(main())


def test_a_caller_during_the_fetch_does_not_start_another() -> None:
    async def main() -> None:
        flight: SingleFlight[str, str] = SingleFlight("test")
        fetcher = Fetcher()
        first = asyncio.create_task(flight.run("k", fetcher.fetch))
        await _until_waiting(flight, [first])
        late = Fetcher("late")  # a caller's own fetch: not called while one runs
        second = asyncio.create_task(flight.run("k", late.fetch))
        await _until_waiting(flight, [first, second])
        fetcher.release.set()
        assert list(await asyncio.gather(first, second)) == ["answer", "answer"]
        assert late.started == 0

    asyncio.run(main())

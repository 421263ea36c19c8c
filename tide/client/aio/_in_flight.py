"""The asyncio producer's bound on unfinished sends: the sync client's bookkeeping
(``tide.client._in_flight.InFlight``: a count and bytes, the same rules and error),
waited for on the event loop instead of a thread condition."""

from __future__ import annotations

import asyncio

from tide.client._in_flight import InFlight


class AioInFlight:
    def __init__(self, max_sends: int, max_bytes: int) -> None:
        self.state = InFlight(max_sends, max_bytes)
        # Set when room is given back; replaced then, so each wait sees the next release.
        self._freed = asyncio.Event()

    async def acquire(self, size_bytes: int, timeout_s: float, what: str) -> None:
        """Wait (backpressure) for room for one send of ``size_bytes``; ResourceExhausted
        after ``timeout_s``. Cancelled while waiting: nothing is taken."""
        if not self.state.fits(size_bytes):
            try:
                async with asyncio.timeout(timeout_s):
                    while not self.state.fits(size_bytes):
                        await self._freed.wait()
            except TimeoutError:
                raise self.state.exhausted(what, timeout_s) from None
        self.state.take(size_bytes)

    def release(self, size_bytes: int) -> None:
        self.state.give_back(size_bytes)
        freed, self._freed = self._freed, asyncio.Event()
        freed.set()

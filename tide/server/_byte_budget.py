"""A bound on the bytes one kind of buffer holds at once (requests in flight, answers
being built), on top of the count bounds: a count alone lets a few huge requests take
all the memory (32 requests of 64 MiB are 2 GiB).

Two ways to stay under it, chosen by the caller for its semantics:

* :meth:`ByteBudget.take` for a request that is already in memory (a unary call, a
  request read from a stream): it fits or it is refused with RESOURCE_EXHAUSTED naming
  the limit (the option) and its value, so the caller may retry later or split it;
* :meth:`ByteBudget.wait_below` for a stream: wait (stop reading from the stream) until
  the bytes held drop below the limit, which holds the sender back through HTTP/2 flow
  control; the next request read then overshoots the limit by at most its own size.

Everything runs on the event loop: no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import grpc

from tide.server._interceptor import ServiceError


class ByteBudget:
    """At most ``limit_bytes`` bytes held at once; ``option`` names the limit in messages
    (the option an operator changes, e.g. ``max_produce_in_flight_bytes``)."""

    def __init__(self, option: str, limit_bytes: int, what: str) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"{option} must be positive, not {limit_bytes}")
        self.option = option
        self.limit_bytes = limit_bytes
        self.what = what  # e.g. "produce requests in flight on this gateway"
        self.in_use_bytes = 0
        self.peak_bytes = 0  # the most held at once since start (metrics, tests)
        self.refused = 0  # requests refused RESOURCE_EXHAUSTED since start
        self._freed = asyncio.Event()

    def take(self, size_bytes: int) -> None:
        """Hold ``size_bytes`` more, or raise RESOURCE_EXHAUSTED when they do not fit."""
        if self.in_use_bytes + size_bytes > self.limit_bytes:
            self.refused += 1
            raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, self._refusal(size_bytes))
        self._add(size_bytes)

    def force(self, size_bytes: int) -> None:
        """Hold ``size_bytes`` more even past the limit (a stream's request read after
        :meth:`wait_below`: it is in memory already, and counted)."""
        self._add(size_bytes)

    def give(self, size_bytes: int) -> None:
        """Release bytes taken before; wakes the streams waiting for room."""
        self.in_use_bytes -= size_bytes
        assert self.in_use_bytes >= 0, self.in_use_bytes
        freed, self._freed = self._freed, asyncio.Event()
        freed.set()

    async def wait_below(self) -> None:
        """Return once fewer than ``limit_bytes`` bytes are held (backpressure)."""
        while self.in_use_bytes >= self.limit_bytes:
            await self._freed.wait()

    @contextlib.contextmanager
    def held(self, size_bytes: int) -> Iterator[None]:
        """:meth:`take` for the duration of the block."""
        self.take(size_bytes)
        try:
            yield
        finally:
            self.give(size_bytes)

    def _add(self, size_bytes: int) -> None:
        self.in_use_bytes += size_bytes
        self.peak_bytes = max(self.peak_bytes, self.in_use_bytes)

    def _refusal(self, size_bytes: int) -> str:
        if size_bytes > self.limit_bytes:
            return (
                f"this request is {size_bytes} bytes, more than {self.option} "
                f"({self.limit_bytes} bytes) allows for all {self.what}: send smaller "
                "requests (or raise the limit)"
            )
        return (
            f"{self.option} ({self.limit_bytes} bytes) reached: {self.in_use_bytes} bytes of "
            f"{self.what}, this request is {size_bytes} bytes; retry later"
        )

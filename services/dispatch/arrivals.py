"""Arrival notices for ``WatchArrivals`` watchers, coalesced per queue.

The dispatcher publishes, after each applied batch, the new max offset of every queue
that grew. Each watcher holds a dict ``(topic, queue_id) -> latest max offset`` and an
event: publishing overwrites the entry and sets the event, so a watcher that reads slowly
(or whose client does not read at all, blocking its stream on flow control) costs at most
one entry per queue it watches, never a backlog. Everything runs on the event loop.

A waiting watch waits on its own event only (``close`` sets every watcher's): no task nor
``asyncio.wait`` per notice, which is on the path of every arrival.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Collection, Iterable

from services.dispatch.engine.dispatch_store import Arrival

QueueKey = tuple[str, int]


class Watcher:
    """One watch: pending max offsets per queue, and an event set when there are some."""

    def __init__(self, topics: Collection[str]) -> None:
        self._topics = frozenset(topics)
        self._pending: dict[QueueKey, int] = {}
        self._ready = asyncio.Event()

    def wants(self, topic: str) -> bool:
        return not self._topics or topic in self._topics

    def offer(self, topic: str, queue_id: int, max_offset: int) -> None:
        if not self.wants(topic):
            return
        key = (topic, queue_id)
        if max_offset > self._pending.get(key, -1):
            self._pending[key] = max_offset
            self._ready.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def take(self) -> dict[QueueKey, int]:
        pending, self._pending = self._pending, {}
        self._ready.clear()
        return pending

    async def wait(self) -> None:
        await self._ready.wait()

    def wake(self) -> None:
        """End a wait without pending offsets (the hub is closing)."""
        self._ready.set()


class ArrivalHub:
    def __init__(self) -> None:
        self._watchers: set[Watcher] = set()
        self._closed = asyncio.Event()

    @property
    def watcher_count(self) -> int:
        return len(self._watchers)

    def publish(self, arrivals: Iterable[Arrival]) -> None:
        watchers = self._watchers
        if not watchers:
            return
        for arrival in arrivals:
            for watcher in watchers:
                watcher.offer(arrival.topic, arrival.queue_id, arrival.max_offset)

    def close(self) -> None:
        """End every watch (the server is draining); later watches end at once."""
        self._closed.set()
        for watcher in self._watchers:
            watcher.wake()

    async def watch(
        self, topics: Collection[str], current: Iterable[Arrival] = ()
    ) -> AsyncGenerator[dict[QueueKey, int], None]:
        """Batches of ``{(topic, queue_id): max_offset}``, each queue at most once a batch,
        until :meth:`close`. ``current`` is offered first (a snapshot of the queues)."""
        watcher = Watcher(topics)
        for arrival in current:
            watcher.offer(arrival.topic, arrival.queue_id, arrival.max_offset)
        self._watchers.add(watcher)
        try:
            while not self._closed.is_set():
                if not watcher.pending:
                    await watcher.wait()
                    if self._closed.is_set():
                        break
                batch = watcher.take()
                if batch:
                    yield batch
        finally:
            self._watchers.discard(watcher)

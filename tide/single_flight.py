"""One fetch per key at a time, shared by every caller that wants it meanwhile.

The gateway's caches (routes, group configs, queue lock states) and its identical pulls
all answer a miss the same way: the first caller starts the fetch, the callers that come
while it runs wait for the same fetch, and nobody fetches twice. :class:`SingleFlight`
is that pattern once:

* the fetch runs as a task of its own, and each caller awaits it shielded: a caller that
  goes away (a cancelled RPC) does not cancel the fetch for the others, and the fetch
  still completes (and fills its cache) when every caller has gone;
* a failed fetch is not kept: every caller waiting for it gets its exception, and the
  next call for the key starts a new fetch;
* what a fetch returns is not kept either (caching, with its expiry, is the caller's:
  the fetch stores what it fetched before it returns).

Event loop only (not thread-safe). Bounded by the callers: one task per distinct key
being fetched now, dropped when it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    def __init__(self, name: str) -> None:
        self._name = name  # names the fetch tasks (asyncio's task dumps)
        self._fetching: dict[K, asyncio.Task[V]] = {}

    def __len__(self) -> int:
        """Fetches running now."""
        return len(self._fetching)

    async def run(self, key: K, fetch: Callable[[], Coroutine[Any, Any, V]]) -> V:
        """The result of the fetch of ``key`` running now, else of ``fetch()`` started
        now (called only then)."""
        task = self._fetching.get(key)
        if task is None:
            # Named without the key: formatting it would cost every fetch (a pull's key).
            task = asyncio.create_task(fetch(), name=self._name)
            self._fetching[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        return await asyncio.shield(task)

    def _done(self, key: K, task: asyncio.Task[V]) -> None:
        if self._fetching.get(key) is task:
            del self._fetching[key]
        if not task.cancelled():
            task.exception()  # retrieved here too: its callers may all have gone

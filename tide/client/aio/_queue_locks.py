"""Queue locks of the asyncio orderly push consumer: the sync tide/client/_queue_locks.py
(its rules, requests and lease arithmetic, shared) on the event loop.

The member locks a queue before its worker starts, renews its locks every
``lock_interval_ms`` (shortened to fit the broker's lease) and unlocks a released queue
after the worker's final commit; a worker delivers only while its lease is valid.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from tide.client._errors import TideError
from tide.client._queue_locks import (
    by_broker,
    lease_until_s,
    lock_request,
    locked_queues,
    renew_interval_ms,
)
from tide.client._types import MessageQueue
from tide.client.aio._connection import AioConnection
from tide.v1 import storage_pb2

_log = logging.getLogger("tide.client.consumer")


class AioQueueLease:
    """Until when a member may deliver a queue's messages (monotonic seconds)."""

    def __init__(self) -> None:
        self._until_s = 0.0
        self._changed = asyncio.Event()

    def valid(self) -> bool:
        return time.monotonic() < self._until_s

    def extend(self, until_s: float) -> None:
        self._until_s = max(self._until_s, until_s)
        self._changed.set()

    async def wait_valid(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the lease to be valid (a renewal); whether it is."""
        self._changed.clear()
        if not self.valid():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._changed.wait()
        return self.valid()


class AioLocker:
    """Lock, renew and unlock a member's queues through the gateway, per broker."""

    def __init__(self, connection: AioConnection, group: str, client_id: str) -> None:
        self._connection = connection
        self._group = group
        self._client_id = client_id
        self.max_live_ms = 0  # the broker's lease as last answered (0: not known yet)

    def renew_interval_ms(self, lock_interval_ms: int) -> float:
        return renew_interval_ms(self.max_live_ms, lock_interval_ms)

    async def lock(self, queues: Iterable[MessageQueue]) -> tuple[set[MessageQueue], float]:
        """Lock or renew ``queues``: those held now, and until when this member may
        deliver them; a broker that fails is logged (its queues are not held)."""
        held: set[MessageQueue] = set()
        until_s = float("inf")
        for broker_name, batch in by_broker(queues):
            sent_s = time.monotonic()
            try:
                answer: storage_pb2.QueueLockResponse = await self._call(
                    self._connection.stub.LockQueues, broker_name, batch, "Lock"
                )
            except TideError as exc:
                _log.warning("locking %d queues of %s failed: %s", len(batch), broker_name, exc)
                continue
            self.max_live_ms = answer.max_live_ms
            until_s = min(until_s, lease_until_s(sent_s, answer.max_live_ms))
            held.update(locked_queues(broker_name, answer))
        return held, until_s

    async def unlock(self, queues: Iterable[MessageQueue]) -> None:
        """Release ``queues`` (after their final commits); a failure is logged: the
        leases then expire on their own."""
        for broker_name, batch in by_broker(queues):
            try:
                await self._call(self._connection.stub.UnlockQueues, broker_name, batch, "Unlock")
            except TideError as exc:
                _log.warning("unlocking queues of %s failed: %s (they expire)", broker_name, exc)

    async def _call(
        self, method: Any, broker_name: str, batch: list[MessageQueue], what: str
    ) -> Any:
        return await self._connection.call(
            method,
            lock_request(self._group, self._client_id, broker_name, batch),
            f"{what}Queues of {len(batch)} queues of {broker_name} for {self._client_id}",
            retry=False,  # the caller's next round is the retry
        )

"""Queue locks for orderly consumers (RocketMQ 4's RebalanceLockManager).

A consumer that consumes its queues in order locks them at the master broker: a lease
per (consumer group, topic, queue id) held by one client id, renewed by the holder
(a lock request for a queue it holds), released by an unlock, and expired
``max_live_ms`` after the holder's last lock request (RocketMQ's
``rebalanceLockMaxLiveTime``, 60 s). A queue whose lease expired may be taken by any
member of the group.

The leases are in memory only. A storage that starts again (or a slave promoted by an
operator) knows nothing of the leases granted before, whose holders may still be
consuming. So for ``max_live_ms`` after the start the manager grants nothing (every
answer is "not locked"): any lease granted before has expired by then, and a holder
that could not renew stops consuming when its own copy of the lease runs out (the
client keeps a lease no longer than the broker's, tide.client). Orderly consumption of
that broker's queues pauses for up to ``max_live_ms`` after a storage restart: safety
(no two members on one queue) over availability, as the issue asks.

Bounded: at most ``max_locks`` leases in all (expired ones are dropped first), past
it a lock request gets RESOURCE_EXHAUSTED naming MAX_QUEUE_LOCKS.

Hand-overs (a metric, ``handovers``): a queue locked by another client than its last
holder, after that one released it (``released``: a rebalance as designed) or after its
lease expired (``expired``: the holder died or could not renew). An unlock therefore
keeps the lease, marked released (it counts as expired everywhere), until the queue is
locked again or the bound needs the room.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# Leases held by one storage (a lease is ~200 bytes): far above groups x queues of a
# real broker, a bound on a client that locks made-up queues.
MAX_QUEUE_LOCKS = 100_000
DEFAULT_MAX_LIVE_MS = 60_000
MIN_MAX_LIVE_MS = 1_000
MAX_MAX_LIVE_MS = 600_000

QueueKey = tuple[str, int]  # (topic, queue id)


HANDOVER_RELEASED = "released"
HANDOVER_EXPIRED = "expired"


@dataclass(slots=True)
class Lease:
    client_id: str
    last_update_ms: int
    released: bool = False  # unlocked by its holder: free, kept to see a hand-over


@dataclass(frozen=True, slots=True)
class LockView:
    topic: str
    queue_id: int
    client_id: str
    expires_in_ms: int  # from the answer (leases use a monotonic clock)


class TooManyLocks(Exception):
    """Granting would pass MAX_QUEUE_LOCKS."""


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class QueueLockManager:
    def __init__(
        self,
        max_live_ms: int = DEFAULT_MAX_LIVE_MS,
        *,
        max_locks: int = MAX_QUEUE_LOCKS,
        clock_ms: Callable[[], int] = _now_ms,
        grace: bool = True,
    ) -> None:
        self.max_live_ms = max_live_ms
        self._max_locks = max_locks
        self._clock_ms = clock_ms
        # Nothing is granted before this (module docstring): leases of a previous run.
        self._grant_from_ms = clock_ms() + max_live_ms if grace else -1
        self._leases: dict[str, dict[QueueKey, Lease]] = {}  # group -> queue -> lease
        self._count = 0
        self._lock = threading.Lock()  # servicer threads and the event loop
        # Queues locked by another client than their last holder, by how (module doc).
        self.handovers = {HANDOVER_RELEASED: 0, HANDOVER_EXPIRED: 0}

    def in_grace(self) -> bool:
        return self._clock_ms() <= self._grant_from_ms

    def lock(self, group: str, client_id: str, queues: Iterable[QueueKey]) -> list[QueueKey]:
        """Lock or renew each queue for ``client_id``; the queues it holds now, in
        request order (RocketMQ's tryLockBatch)."""
        now_ms = self._clock_ms()
        if now_ms <= self._grant_from_ms:
            return []
        with self._lock:
            leases = self._leases.setdefault(group, {})
            locked: list[QueueKey] = []
            for queue in queues:
                lease = leases.get(queue)
                if lease is None:
                    self._make_room(now_ms, group)
                    leases[queue] = Lease(client_id, now_ms)
                    self._count += 1
                elif lease.client_id == client_id or self._expired(lease, now_ms):
                    if lease.client_id != client_id:
                        how = HANDOVER_RELEASED if lease.released else HANDOVER_EXPIRED
                        self.handovers[how] += 1
                    lease.client_id = client_id
                    lease.last_update_ms = now_ms
                    lease.released = False
                else:
                    continue
                locked.append(queue)
            return locked

    def unlock(self, group: str, client_id: str, queues: Iterable[QueueKey]) -> int:
        """Release the queues ``client_id`` holds among ``queues``; how many it held."""
        with self._lock:
            leases = self._leases.get(group)
            if leases is None:
                return 0
            released = 0
            for queue in queues:
                lease = leases.get(queue)
                if lease is not None and lease.client_id == client_id and not lease.released:
                    lease.released = True  # kept: the next lock by another is a hand-over
                    released += 1
            return released

    def holder(self, group: str, topic: str, queue_id: int) -> str | None:
        """The client id holding an unexpired lease on the queue, or None."""
        now_ms = self._clock_ms()
        with self._lock:
            lease = self._leases.get(group, {}).get((topic, queue_id))
            if lease is None or self._expired(lease, now_ms):
                return None
            return lease.client_id

    def locks(self, group: str, topic: str = "") -> list[LockView]:
        """The unexpired leases of ``group`` (of ``topic`` only when given), sorted."""
        now_ms = self._clock_ms()
        with self._lock:
            leases = list(self._leases.get(group, {}).items())
        return [
            LockView(
                queue[0],
                queue[1],
                lease.client_id,
                lease.last_update_ms + self.max_live_ms - now_ms,
            )
            for queue, lease in sorted(leases)
            if (not topic or queue[0] == topic) and not self._expired(lease, now_ms)
        ]

    def held(self) -> int:
        """Unexpired leases of every group (a metric: one pass over the leases)."""
        now_ms = self._clock_ms()
        with self._lock:
            return sum(
                not self._expired(lease, now_ms)
                for leases in self._leases.values()
                for lease in leases.values()
            )

    def _expired(self, lease: Lease, now_ms: int) -> bool:
        return lease.released or now_ms - lease.last_update_ms > self.max_live_ms

    def _make_room(self, now_ms: int, locking_group: str) -> None:
        """Drop expired leases when full; TooManyLocks when none is. The group being
        locked keeps its (perhaps empty) table: the caller adds to it."""
        if self._count < self._max_locks:
            return
        for group in list(self._leases):
            leases = self._leases[group]
            for queue in [q for q, lease in leases.items() if self._expired(lease, now_ms)]:
                del leases[queue]
                self._count -= 1
            if not leases and group != locking_group:
                del self._leases[group]
        if self._count >= self._max_locks:
            raise TooManyLocks(
                f"this storage holds {self._count} queue locks; the limit is "
                f"MAX_QUEUE_LOCKS = {self._max_locks}: unlock queues no longer consumed"
            )

"""SYNC_MASTER: appends wait until a slave acknowledged past their records (RocketMQ's
GroupTransferService, without its thread).

An appender asks with :meth:`SlaveAckWaiter.request` and waits on the returned future.
Waiters sit in a heap ordered by end offset; every ack completes, in one pass, all those
the ack offset passed. No thread and no timer per waiter: the caller bounds its wait and
cancels the future when it gives up (cancelled ones are dropped lazily).

When no slave is connected, or the best slave is more than ``max_gap_bytes`` behind the
record, the future completes at once with ``NOT_AVAILABLE`` (RocketMQ's isSlaveOK check).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import threading
from concurrent.futures import Future

MAX_WAITING_REQUESTS = 100_000


class ReplicaOutcome(enum.Enum):
    ACKED = "acked"  # a slave acknowledged past the record
    NOT_AVAILABLE = "not_available"  # no slave connected, or too far behind


def _done(outcome: ReplicaOutcome) -> Future[ReplicaOutcome]:
    future: Future[ReplicaOutcome] = Future()
    future.set_result(outcome)
    return future


class SlaveAckWaiter:
    def __init__(
        self,
        *,
        max_gap_bytes: int,
        timeout_ms: int,
        max_waiting: int = MAX_WAITING_REQUESTS,
    ) -> None:
        if max_gap_bytes <= 0 or timeout_ms <= 0 or max_waiting <= 0:
            raise ValueError("max_gap_bytes, timeout_ms and max_waiting must be > 0")
        self.max_gap_bytes = max_gap_bytes
        self.timeout_s = timeout_ms / 1000
        self._max_waiting = max_waiting
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int, Future[ReplicaOutcome]]] = []
        self._seq = itertools.count()
        self._slaves = 0
        self._closed = False
        # The highest offset any slave acknowledged (RocketMQ's push2SlaveMaxOffset).
        self.ack_offset = 0

    @property
    def waiting(self) -> int:
        return len(self._heap)

    @property
    def slaves(self) -> int:
        return self._slaves

    def request(self, end_offset: int) -> Future[ReplicaOutcome]:
        """A future that completes once a slave acknowledged ``end_offset``."""
        with self._lock:
            if self._closed or self._slaves == 0:
                return _done(ReplicaOutcome.NOT_AVAILABLE)
            if end_offset <= self.ack_offset:
                return _done(ReplicaOutcome.ACKED)
            if end_offset - self.ack_offset > self.max_gap_bytes:
                return _done(ReplicaOutcome.NOT_AVAILABLE)
            if len(self._heap) >= self._max_waiting:
                self._heap = [item for item in self._heap if not item[2].done()]
                heapq.heapify(self._heap)
                if len(self._heap) >= self._max_waiting:
                    return _done(ReplicaOutcome.NOT_AVAILABLE)
            future: Future[ReplicaOutcome] = Future()
            heapq.heappush(self._heap, (end_offset, next(self._seq), future))
            return future

    def slave_connected(self) -> None:
        with self._lock:
            self._slaves += 1

    def slave_disconnected(self) -> None:
        """Waiters keep waiting (another slave may ack, or they time out)."""
        with self._lock:
            if self._slaves <= 0:
                raise RuntimeError("slave_disconnected without a connected slave")
            self._slaves -= 1

    def ack(self, offset: int) -> int:
        """A slave has everything below ``offset``; returns how many waiters completed."""
        ready: list[Future[ReplicaOutcome]] = []
        with self._lock:
            self.ack_offset = max(self.ack_offset, offset)
            heap = self._heap
            while heap and heap[0][0] <= self.ack_offset:
                ready.append(heapq.heappop(heap)[2])
        return _complete(ready, ReplicaOutcome.ACKED)

    def close(self) -> None:
        """Complete every waiter with NOT_AVAILABLE; later requests get it at once."""
        with self._lock:
            self._closed = True
            ready = [item[2] for item in self._heap]
            self._heap = []
        _complete(ready, ReplicaOutcome.NOT_AVAILABLE)


def _complete(futures: list[Future[ReplicaOutcome]], outcome: ReplicaOutcome) -> int:
    """Complete every future not cancelled by its waiter (outside the lock: callbacks run)."""
    completed = 0
    for future in futures:
        if future.set_running_or_notify_cancel():
            future.set_result(outcome)
            completed += 1
    return completed


__all__ = ["MAX_WAITING_REQUESTS", "ReplicaOutcome", "SlaveAckWaiter"]

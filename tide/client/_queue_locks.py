"""Queue locks of an orderly push consumer (RocketMQ 4's lockBatchMQ / unlockBatchMQ).

An orderly member consumes a queue only while it holds the queue's lock at the
broker's master. It locks a queue before its worker starts, renews all its locks every
``lock_interval_ms`` (RocketMQ's 20 s), and unlocks a released queue only after the
worker's final commit. The broker keeps a lease ``max_live_ms`` after the lock request
it received; the member keeps its own copy shorter, CLIENT_LEASE_FRACTION of it counted
from when it *sent* the request, so it stops delivering before the broker could give
the queue to another member (RocketMQ's client-side 30 s against the broker's 60 s).
A callback longer than the difference (30 s by default) may overlap the next holder's
first message: keep callbacks short.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TypeVar

import grpc

from tide.client._errors import TideError
from tide.client._rpc import Connection
from tide.client._types import MessageQueue
from tide.limits import LOCK_QUEUES_MAX_COUNT
from tide.v1 import gateway_pb2, storage_pb2

_log = logging.getLogger("tide.client.consumer")
_R = TypeVar("_R", storage_pb2.QueueLockResponse, storage_pb2.QueueUnlockResponse)

# The part of the broker's lease a member uses (module doc).
CLIENT_LEASE_FRACTION = 0.5
# Renewals come at least this often within the member's lease (20 s of 30 s by default,
# RocketMQ's lock interval), whatever lock_interval_ms says: a broker with a short lease
# must not see its leases lapse between renewals.
RENEWALS_PER_LEASE = 1.5


class QueueLease:
    """Until when a member may deliver a queue's messages (monotonic seconds)."""

    def __init__(self) -> None:
        self._until_s = 0.0
        self._changed = threading.Condition()

    def valid(self) -> bool:
        return time.monotonic() < self._until_s

    def extend(self, until_s: float) -> None:
        with self._changed:
            self._until_s = max(self._until_s, until_s)
            self._changed.notify_all()

    def wait_valid(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the lease to be valid; whether it is."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not self.valid():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True


class Locker:
    """Lock, renew and unlock a member's queues through the gateway, per broker."""

    def __init__(self, connection: Connection, group: str, client_id: str) -> None:
        self._connection = connection
        self._group = group
        self._client_id = client_id
        # The broker's lease as last answered (0: not known yet).
        self.max_live_ms = 0

    def renew_interval_ms(self, lock_interval_ms: int) -> float:
        """``lock_interval_ms``, shortened to fit the broker's lease (RENEWALS_PER_LEASE)."""
        return renew_interval_ms(self.max_live_ms, lock_interval_ms)

    def lock(self, queues: Iterable[MessageQueue]) -> tuple[set[MessageQueue], float]:
        """Lock or renew ``queues``: those held now, and until when (monotonic seconds)
        this member may deliver them. A broker that fails is logged: its queues are
        not held (their leases run out unless a later renewal succeeds)."""
        held: set[MessageQueue] = set()
        until_s = float("inf")
        for broker_name, batch in by_broker(queues):
            sent_s = time.monotonic()
            try:
                answer = self._call(self._connection.stub.LockQueues, broker_name, batch, "Lock")
            except TideError as exc:
                _log.warning("locking %d queues of %s failed: %s", len(batch), broker_name, exc)
                continue
            self.max_live_ms = answer.max_live_ms
            until_s = min(until_s, lease_until_s(sent_s, answer.max_live_ms))
            held.update(locked_queues(broker_name, answer))
        return held, until_s

    def unlock(self, queues: Iterable[MessageQueue]) -> None:
        """Release ``queues`` (after their final commits); a failure is logged: the
        leases then expire on their own."""
        for broker_name, batch in by_broker(queues):
            try:
                self._call(self._connection.stub.UnlockQueues, broker_name, batch, "Unlock")
            except TideError as exc:
                _log.warning("unlocking queues of %s failed: %s (they expire)", broker_name, exc)

    def _call(
        self,
        method: grpc.UnaryUnaryMultiCallable[gateway_pb2.BrokerQueueLockRequest, _R],
        broker_name: str,
        batch: list[MessageQueue],
        what: str,
    ) -> _R:
        request = lock_request(self._group, self._client_id, broker_name, batch)
        return self._connection.call(
            method,
            request,
            f"{what}Queues of {len(batch)} queues of {broker_name} for {self._client_id}",
            retry=False,  # the caller's next round is the retry
        )


def renew_interval_ms(max_live_ms: int, lock_interval_ms: int) -> float:
    """``lock_interval_ms``, shortened to fit the broker's lease (RENEWALS_PER_LEASE);
    ``max_live_ms`` 0: the lease is not known yet."""
    if not max_live_ms:
        return lock_interval_ms
    lease_ms = max_live_ms * CLIENT_LEASE_FRACTION
    return min(lock_interval_ms, lease_ms / RENEWALS_PER_LEASE)


def lease_until_s(sent_s: float, max_live_ms: int) -> float:
    """Until when (monotonic seconds) a lock sent at ``sent_s`` lets the member deliver."""
    return sent_s + max_live_ms * CLIENT_LEASE_FRACTION / 1000


def locked_queues(broker_name: str, answer: storage_pb2.QueueLockResponse) -> list[MessageQueue]:
    return [MessageQueue(q.topic, broker_name, q.queue_id) for q in answer.locked]


def lock_request(
    group: str, client_id: str, broker_name: str, batch: list[MessageQueue]
) -> gateway_pb2.BrokerQueueLockRequest:
    return gateway_pb2.BrokerQueueLockRequest(
        broker_name=broker_name,
        request=storage_pb2.QueueLockRequest(
            consumer_group=group,
            client_id=client_id,
            queues=[storage_pb2.LockedQueue(topic=q.topic, queue_id=q.queue_id) for q in batch],
        ),
    )


def by_broker(queues: Iterable[MessageQueue]) -> list[tuple[str, list[MessageQueue]]]:
    """Queues per broker, in batches of at most LOCK_QUEUES_MAX_COUNT."""
    grouped: dict[str, list[MessageQueue]] = {}
    for queue in sorted(queues):
        grouped.setdefault(queue.broker_name, []).append(queue)
    return [
        (broker, batch[start : start + LOCK_QUEUES_MAX_COUNT])
        for broker, batch in grouped.items()
        for start in range(0, len(batch), LOCK_QUEUES_MAX_COUNT)
    ]

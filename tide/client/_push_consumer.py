"""``PushConsumer``: a group member that is given queues and has messages pushed to a
callback.

A control thread heartbeats the group through the gateway and rebalances: it reads the
topic's queues and the group's members, splits the queues as RocketMQ's
AllocateMessageQueueAveragely does, releases queues it lost (each released queue commits
its final offset before ``release`` returns) and starts a :class:`QueueWorker` per
queue it gained. A gained queue whose previous owner is still a member is taken only
after ``takeover_delay_ms``, by which time that owner has seen the change and committed;
a queue whose owner left (``shutdown`` commits, then unregisters) is taken at once.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from types import TracebackType

from tide.auth.client import Credentials
from tide.client._allocate import owner_gone
from tide.client._errors import TideError, TopicNotFound
from tide.client._pull_consumer import GatewayReader
from tide.client._push_options import (
    assigned,
    heartbeat_request,
    owners_by_topic,
    push_options,
)
from tide.client._queue_locks import Locker, QueueLease
from tide.client._queue_worker import Callback, QueueWorker
from tide.client._rpc import (
    DEFAULT_GATEWAY,
    DEFAULT_RPC_TIMEOUT_MS,
    ClientTls,
    Connection,
    RetryPolicy,
)
from tide.client._start_offset import ConsumeFrom
from tide.client._types import MessageQueue
from tide.v1 import storage_pb2

_log = logging.getLogger("tide.client.consumer")

# Orderly: a queue whose lock another member holds is asked for again this often.
LOCK_RETRY_MS = 1_000


class PushConsumer:
    """Consumes ``topic`` as one member of ``group``: ``callback(message)`` is called once
    per message, in queue order within a queue; queues are consumed in parallel (one
    thread per assigned queue, at most ``max_queues``), so the callback must be
    thread-safe.

    Offsets are committed after the callback returned: every ``commit_interval_ms`` while
    busy, whenever the queue is drained, when a queue is released and at ``shutdown``.
    Delivery is at-least-once; see docs/client.md for the duplicate window.

    A callback that raises, or returns ``ConsumeResult.RECONSUME_LATER``, has the message
    sent back to its broker (RocketMQ's consumer send-back) and the queue moves on: the
    message comes again later from the group's retry topic ``%RETRY%<group>``, which
    every member also consumes (its queues are split among the members like the
    topic's), after the group's retry policy's delay, with ``message.topic`` the
    original topic and ``message.attempt`` 2, 3, ...; after the group's
    ``retry_max_times`` (or ``max_reconsume_times``, when > 0) it goes to the
    dead-letter queue ``%DLQ%<group>`` instead. A send-back that fails (gateway or
    broker down) is tried again with a doubling backoff from ``retry_backoff_ms`` (at
    most 5 s apart, or ``retry_backoff_ms`` when longer), the message consumed again in
    between: it is never dropped, and its queue does not move past it meanwhile.

    ``orderly=True`` keeps a queue's order instead (RocketMQ's orderly consumer,
    docs/client.md "Ordering"): the member locks each queue at its broker before
    consuming it and renews its locks every ``lock_interval_ms``; one message of a
    queue is delivered at a time; a failing message suspends its queue and is retried
    here ``max_retries`` times with that backoff, then sent to the dead-letter queue
    (the retry topic is not used). A queue is handed over to another member only after
    this one's final commit and unlock, or after its lock expired: no two members
    deliver one queue at once.

    ``consume_from`` decides the start in a queue the group has no committed offset for:
    "last" (only messages sent from then on), "first" (the oldest stored), or a time (ms
    since epoch, an ISO-8601 string or a datetime).
    """

    def __init__(
        self,
        group: str,
        topic: str,
        expression: str,
        callback: Callback,
        gateway: str = DEFAULT_GATEWAY,
        *,
        consume_from: str | int | dt.datetime | ConsumeFrom = "last",
        client_id: str | None = None,
        heartbeat_interval_ms: int = 10_000,
        rebalance_interval_ms: int = 5_000,
        takeover_delay_ms: int | None = None,
        long_poll_timeout_ms: int = 15_000,
        max_messages: int = 32,
        min_messages: int = 0,
        min_messages_wait_ms: int = 0,
        commit_interval_ms: int = 5_000,
        max_retries: int = 3,
        retry_backoff_ms: int = 1_000,
        max_queues: int = 64,
        release_timeout_ms: int = 30_000,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        tls: ClientTls = False,
        credentials: Credentials | None = None,
        orderly: bool = False,
        max_reconsume_times: int = 0,
        lock_interval_ms: int = 20_000,
    ) -> None:
        options = push_options(
            group,
            topic,
            expression,
            consume_from=consume_from,
            client_id=client_id,
            heartbeat_interval_ms=heartbeat_interval_ms,
            rebalance_interval_ms=rebalance_interval_ms,
            takeover_delay_ms=takeover_delay_ms,
            long_poll_timeout_ms=long_poll_timeout_ms,
            max_messages=max_messages,
            min_messages=min_messages,
            min_messages_wait_ms=min_messages_wait_ms,
            commit_interval_ms=commit_interval_ms,
            max_retries=max_retries,
            retry_backoff_ms=retry_backoff_ms,
            max_queues=max_queues,
            release_timeout_ms=release_timeout_ms,
            orderly=orderly,
            max_reconsume_times=max_reconsume_times,
            lock_interval_ms=lock_interval_ms,
        )
        self.group = group
        self.topic = topic
        self.retry_topic = options.retry_topic
        self.client_id = options.client_id
        self._expression = options.expression
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._rebalance_interval_ms = rebalance_interval_ms
        self._takeover_delay_ms = options.takeover_delay_ms
        self._max_queues = max_queues
        self._release_timeout_ms = release_timeout_ms
        self._callback = callback
        self._settings = options.settings
        self._retry_settings = options.retry_settings
        self._reader = GatewayReader(
            Connection(
                gateway,
                rpc_timeout_ms=rpc_timeout_ms,
                retry=retry,
                tls=tls,
                credentials=credentials,
            )
        )
        self._orderly = orderly
        self._lock_interval_ms = lock_interval_ms
        self._locker = Locker(self._reader.connection, group, self.client_id)
        self._leases: dict[MessageQueue, QueueLease] = {}  # orderly: of the workers
        self._workers: dict[MessageQueue, QueueWorker] = {}
        # Queues to take at a monotonic time (their previous owner is still releasing).
        self._pending: dict[MessageQueue, float] = {}
        self._last_view: tuple[list[MessageQueue], list[str]] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._started = False
        self._thread = threading.Thread(
            target=self._control_loop, name=f"tide-rebalance-{self.client_id}", daemon=True
        )

    # ---- public

    def start(self) -> PushConsumer:
        """Join the group (heartbeat), take the first assignment and start consuming.
        Raises when the gateway is unreachable or the topic does not exist."""
        with self._lock:
            if self._started:
                raise TideError("the consumer was started already")
            self._started = True
        try:
            self._heartbeat()
            self._rebalance()
        except BaseException:
            self._abandon()
            raise
        self._thread.start()
        return self

    def _abandon(self) -> None:
        """After a failed start: release what was taken and close; a failure here is logged
        (the start's error is the one raised)."""
        try:
            self.shutdown()
        except TideError as exc:
            _log.error("cleaning up after a failed start of %s: %s", self.client_id, exc)

    def assignment(self) -> list[MessageQueue]:
        """The topic's queues this member consumes now (sorted), not counting pending
        takeovers."""
        with self._lock:
            return sorted(q for q in self._workers if q.topic == self.topic)

    def retry_assignment(self) -> list[MessageQueue]:
        """The retry topic's queues (``%RETRY%<group>``) this member consumes now."""
        with self._lock:
            return sorted(q for q in self._workers if q.topic == self.retry_topic)

    def pending(self) -> list[MessageQueue]:
        """Queues assigned to this member that it takes once their previous owner released."""
        with self._lock:
            return sorted(self._pending)

    def rebalance_now(self) -> None:
        """Ask the control thread to rebalance at once (e.g. after a member change)."""
        self._wake.set()

    def shutdown(self) -> None:
        """Stop pulling, commit every queue's offset, and leave the group so the others
        take the queues at once. Idempotent; raises the unregister error, if any, after
        everything is closed."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            started = self._started
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
            self._pending.clear()
        self._release(workers)
        error: TideError | None = None
        if started:
            try:
                self._unregister()
            except TideError as exc:
                _log.error("leaving group %r failed: %s", self.group, exc)
                error = exc
        self._reader.connection.close()
        if error is not None:
            raise error

    def __enter__(self) -> PushConsumer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    # ---- control thread

    def _control_loop(self) -> None:
        now = time.monotonic()
        next_heartbeat = now + self._heartbeat_interval_ms / 1000
        next_rebalance = now + self._rebalance_interval_ms / 1000
        last_lock = now  # orderly: the last renewal (its interval follows the lease)
        while not self._stop.is_set():
            now = time.monotonic()
            next_lock = self._next_renewal(last_lock)
            try:
                if now >= next_lock:
                    last_lock = now
                    next_lock = self._next_renewal(last_lock)
                    self._renew_locks()
                if now >= next_heartbeat:
                    next_heartbeat = now + self._heartbeat_interval_ms / 1000
                    self._heartbeat()
                if now >= next_rebalance or self._wake.is_set():
                    self._wake.clear()
                    next_rebalance = now + self._rebalance_interval_ms / 1000
                    self._rebalance()
                self._take_due()
            except TideError as exc:
                _log.warning("consumer %s of group %r: %s", self.client_id, self.group, exc)
            except Exception:
                _log.exception("consumer %s: unexpected error in rebalance", self.client_id)
            with self._lock:
                due = min(self._pending.values(), default=next_rebalance)
            wait_s = min(next_heartbeat, next_rebalance, due, next_lock) - time.monotonic()
            if wait_s > 0:
                self._wake.wait(wait_s)

    def _next_renewal(self, last_lock: float) -> float:
        """When the orderly locks are renewed next (never, when not orderly)."""
        if not self._orderly:
            return float("inf")
        return last_lock + self._locker.renew_interval_ms(self._lock_interval_ms) / 1000

    def _heartbeat(self) -> None:
        connection = self._reader.connection
        connection.call(
            connection.stub.Heartbeat,
            heartbeat_request(self.group, self.client_id, self.topic, self._expression),
            f"Heartbeat of {self.client_id} in group {self.group!r}",
        )

    def _unregister(self) -> None:
        connection = self._reader.connection
        connection.call(
            connection.stub.UnregisterConsumer,
            storage_pb2.UnregisterConsumerRequest(
                consumer_group=self.group, client_id=self.client_id
            ),
            f"UnregisterConsumer {self.client_id} from group {self.group!r}",
        )

    def _members(self) -> list[str]:
        connection = self._reader.connection
        response = connection.call(
            connection.stub.GetConsumers,
            storage_pb2.GetConsumersRequest(consumer_group=self.group),
            f"GetConsumers of group {self.group!r}",
        )
        return sorted({member.client_id for member in response.members})

    def _queues(self) -> list[MessageQueue]:
        """The topic's readable queues, then its retry topic's (none until the brokers
        created it: a heartbeat of the group does)."""
        queues = self._reader.queues(self.topic)
        try:
            retry_queues = self._reader.queues(self.retry_topic)
        except TopicNotFound:
            retry_queues = []
        return queues + retry_queues

    def _rebalance(self) -> None:
        queues = self._queues()
        members = self._members()
        if self.client_id not in members:
            _log.warning(
                "consumer %s is not (yet) a member of group %r (members: %s); it consumes "
                "nothing until its heartbeat is seen",
                self.client_id,
                self.group,
                members,
            )
            self._heartbeat()
        # Each topic's queues are split on their own (RocketMQ rebalances per topic).
        # Orderly: no retry topic (failures are retried locally, then dead-lettered).
        topics = (self.topic,) if self._orderly else (self.topic, self.retry_topic)
        mine = assigned(queues, members, self.client_id, topics, self._max_queues)
        target = set(mine)
        previous = self._last_view
        self._last_view = (queues, members)
        with self._lock:
            if self._stop.is_set():
                return
            lost = [w for q, w in self._workers.items() if q not in target]
            for worker in lost:
                del self._workers[worker.queue]
            for queue in [q for q in self._pending if q not in target]:
                del self._pending[queue]
        if lost:
            _log.info("consumer %s releases %s", self.client_id, [str(w.queue) for w in lost])
            self._release(lost)
        now = time.monotonic()
        previous_owners = owners_by_topic(*previous) if previous is not None else None
        with self._lock:
            for queue in sorted(target):
                if queue in self._workers or queue in self._pending:
                    continue
                if self._orderly or owner_gone(queue, self.client_id, previous_owners, members):
                    # Orderly: the lock decides when it may be taken (_take_due).
                    self._pending[queue] = now
                else:
                    self._pending[queue] = now + self._takeover_delay_ms / 1000
        self._take_due()

    def _take_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self._stop.is_set():
                return
            due = sorted(q for q, at in self._pending.items() if at <= now)
            if self._orderly and due:
                for queue in due:
                    del self._pending[queue]
        if self._orderly and due:
            due = self._lock_due(due)
        with self._lock:
            if self._stop.is_set():
                return  # shutdown releases what was taken (an orderly lock expires)
            for queue in due:
                self._pending.pop(queue, None)
                settings = (
                    self._retry_settings if queue.topic == self.retry_topic else self._settings
                )
                lease = self._leases.get(queue)
                worker = QueueWorker(
                    queue,
                    self._reader,
                    settings,
                    self._callback,
                    lease,
                    self.client_id if lease is not None else "",
                )
                self._workers[queue] = worker
                worker.start()
        if due:
            _log.info("consumer %s takes %s", self.client_id, [str(q) for q in due])

    def _lock_due(self, due: list[MessageQueue]) -> list[MessageQueue]:
        """Orderly: lock the due queues; those locked get a lease, the others wait
        (pending again) for their holder's unlock or expiry."""
        held, until_s = self._locker.lock(due)
        retry_at = time.monotonic() + min(self._lock_interval_ms, LOCK_RETRY_MS) / 1000
        with self._lock:
            for queue in due:
                if queue in held:
                    lease = self._leases[queue] = QueueLease()
                    lease.extend(until_s)
                else:
                    self._pending[queue] = retry_at
        waiting = [str(q) for q in due if q not in held]
        if waiting:
            _log.info("consumer %s waits for the locks of %s", self.client_id, waiting)
        return [queue for queue in due if queue in held]

    def _renew_locks(self) -> None:
        """Orderly: renew the locks of the queues consumed (RocketMQ's lockAll)."""
        with self._lock:
            queues = list(self._leases)
        if not queues:
            return
        held, until_s = self._locker.lock(queues)
        with self._lock:
            for queue in queues:
                lease = self._leases.get(queue)
                if lease is not None and queue in held:
                    lease.extend(until_s)
        lost = [str(q) for q in queues if q not in held]
        if lost:
            _log.warning(
                "consumer %s could not renew the locks of %s: they pause when the lease "
                "runs out and resume if a later renewal succeeds",
                self.client_id,
                lost,
            )

    def _release(self, workers: list[QueueWorker]) -> None:
        """Stop the workers and wait for their final commits (bounded); orderly: then
        unlock the queues whose worker stopped (the others' locks expire)."""
        for worker in workers:
            worker.stop()
        deadline = time.monotonic() + self._release_timeout_ms / 1000
        stopped: list[MessageQueue] = []
        for worker in workers:
            if worker.join(max(0.0, deadline - time.monotonic())):
                stopped.append(worker.queue)
            else:
                _log.error(
                    "consumer of %s did not stop within %d ms (a slow callback?); its final "
                    "commit comes late and the next owner may repeat messages",
                    worker.queue,
                    self._release_timeout_ms,
                )
        if self._orderly:
            with self._lock:
                for worker in workers:
                    self._leases.pop(worker.queue, None)
            if stopped:
                self._locker.unlock(stopped)

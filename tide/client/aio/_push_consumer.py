"""``PushConsumer`` of tide.client.aio: a group member whose assigned queues are consumed
by tasks on the event loop, the handler a coroutine function.

The sync PushConsumer's group protocol (``tide.client._push_consumer``): a control task
heartbeats the group and rebalances with the same split (``_push_options.assigned``),
releases lost queues (each commits its final offset first) and takes a gained queue at
once when its previous owner left, else after ``takeover_delay_ms``."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from types import TracebackType

from tide.auth.client import Credentials
from tide.client._allocate import owner_gone
from tide.client._errors import InvalidArgument, TideError, TopicNotFound
from tide.client._push_consumer import LOCK_RETRY_MS
from tide.client._push_options import assigned, heartbeat_request, owners_by_topic, push_options
from tide.client._rpc import DEFAULT_GATEWAY, DEFAULT_RPC_TIMEOUT_MS, ClientTls, RetryPolicy
from tide.client._start_offset import ConsumeFrom
from tide.client._types import MessageQueue
from tide.client.aio._connection import AioConnection
from tide.client.aio._pull_consumer import AioReader
from tide.client.aio._queue_locks import AioLocker, AioQueueLease
from tide.client.aio._queue_worker import AioQueueWorker, Handler
from tide.v1 import storage_pb2

_log = logging.getLogger("tide.client.consumer")


class PushConsumer:
    """Consumes ``topic`` as one member of ``group``: ``await handler(message)`` once per
    message, in queue order within a queue, queues in parallel (a task each, at most
    ``max_queues``). The sync PushConsumer's options (same names and defaults), retry
    and dead-letter rules (docs/client.md); ``orderly=True`` as the sync one's: each queue
    locked at its broker before it is consumed, the locks renewed, a failed message
    retried in place, the queue unlocked after its final commit.

    ``start()`` (or ``async with``) joins the group; ``shutdown()`` (``close()``) stops
    pulling, gives each running handler up to ``release_timeout_ms`` to finish, then
    cancels it (its message is not committed: the group gets it again), commits every
    queue and leaves the group. Idempotent."""

    def __init__(
        self,
        group: str,
        topic: str,
        expression: str,
        handler: Handler,
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
        max_reconsume_times: int = 0,
        orderly: bool = False,
        lock_interval_ms: int = 20_000,
    ) -> None:
        if not asyncio.iscoroutinefunction(handler):
            raise InvalidArgument("handler must be a coroutine function (async def)")
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
        self._options = options
        self._heartbeat_s = heartbeat_interval_ms / 1000
        self._rebalance_s = rebalance_interval_ms / 1000
        self._max_queues = max_queues
        self._release_s = release_timeout_ms / 1000
        self._handler = handler
        self._reader = AioReader(
            AioConnection(
                gateway,
                rpc_timeout_ms=rpc_timeout_ms,
                retry=retry,
                tls=tls,
                credentials=credentials,
            )
        )
        self._orderly = orderly
        self._lock_interval_ms = lock_interval_ms
        self._locker = AioLocker(self._reader.connection, group, self.client_id)
        self._leases: dict[MessageQueue, AioQueueLease] = {}  # orderly: of the workers
        self._workers: dict[MessageQueue, AioQueueWorker] = {}
        self._pending: dict[MessageQueue, float] = {}  # queue -> monotonic time to take it
        self._last_view: tuple[list[MessageQueue], list[str]] | None = None
        self._wake = asyncio.Event()
        self._started = False
        self._stopped = False
        self._control: asyncio.Task[None] | None = None

    # ---- public

    async def start(self) -> PushConsumer:
        """Join the group, take the first assignment and start consuming. Raises when
        the gateway is unreachable or the topic does not exist."""
        if self._started:
            raise TideError("the consumer was started already")
        self._started = True
        try:
            await self._heartbeat()
            await self._rebalance()
        except BaseException:
            with contextlib.suppress(TideError):
                await self.shutdown()
            raise
        self._control = asyncio.get_running_loop().create_task(self._control_loop())
        return self

    def assignment(self) -> list[MessageQueue]:
        """The topic's queues this member consumes now (sorted)."""
        return sorted(q for q in self._workers if q.topic == self.topic)

    def retry_assignment(self) -> list[MessageQueue]:
        """The retry topic's queues (``%RETRY%<group>``) this member consumes now."""
        return sorted(q for q in self._workers if q.topic == self.retry_topic)

    def pending(self) -> list[MessageQueue]:
        """Queues assigned to this member that it takes once their previous owner released."""
        return sorted(self._pending)

    def rebalance_now(self) -> None:
        """Ask the control task to rebalance at once."""
        self._wake.set()

    async def shutdown(self) -> None:
        """Stop, commit every queue, leave the group; raises the unregister error, if
        any, after everything is closed. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._control is not None:
            self._control.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._control
        workers = list(self._workers.values())
        self._workers.clear()
        self._pending.clear()
        await self._release(workers)
        error: TideError | None = None
        if self._started:
            try:
                await self._call_unregister()
            except TideError as exc:
                _log.error("leaving group %r failed: %s", self.group, exc)
                error = exc
        await self._reader.connection.close()
        if error is not None:
            raise error

    close = shutdown

    async def __aenter__(self) -> PushConsumer:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

    # ---- control task

    async def _control_loop(self) -> None:
        now = time.monotonic()
        next_heartbeat = now + self._heartbeat_s
        next_rebalance = now + self._rebalance_s
        next_lock = self._next_renewal(now)
        while True:
            now = time.monotonic()
            try:
                if now >= next_lock:
                    next_lock = self._next_renewal(now)
                    await self._renew_locks()
                if now >= next_heartbeat:
                    next_heartbeat = now + self._heartbeat_s
                    await self._heartbeat()
                if now >= next_rebalance or self._wake.is_set():
                    self._wake.clear()
                    next_rebalance = now + self._rebalance_s
                    await self._rebalance()
                await self._take_due()
            except TideError as exc:
                _log.warning("consumer %s of group %r: %s", self.client_id, self.group, exc)
            except Exception:
                _log.exception("consumer %s: unexpected error in rebalance", self.client_id)
            due = min(self._pending.values(), default=next_rebalance)
            wait_s = min(next_heartbeat, next_rebalance, due, next_lock) - time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, wait_s)):
                    await self._wake.wait()

    async def _heartbeat(self) -> None:
        connection = self._reader.connection
        await connection.call(
            connection.stub.Heartbeat,
            heartbeat_request(self.group, self.client_id, self.topic, self._options.expression),
            f"Heartbeat of {self.client_id} in group {self.group!r}",
        )

    async def _call_unregister(self) -> None:
        connection = self._reader.connection
        await connection.call(
            connection.stub.UnregisterConsumer,
            storage_pb2.UnregisterConsumerRequest(
                consumer_group=self.group, client_id=self.client_id
            ),
            f"UnregisterConsumer {self.client_id} from group {self.group!r}",
        )

    async def _members(self) -> list[str]:
        connection = self._reader.connection
        response = await connection.call(
            connection.stub.GetConsumers,
            storage_pb2.GetConsumersRequest(consumer_group=self.group),
            f"GetConsumers of group {self.group!r}",
        )
        return sorted({member.client_id for member in response.members})

    async def _queues(self) -> list[MessageQueue]:
        queues = await self._reader.queues(self.topic)
        try:
            retry_queues = await self._reader.queues(self.retry_topic)
        except TopicNotFound:  # until a heartbeat of the group made the brokers create it
            retry_queues = []
        return queues + retry_queues

    async def _rebalance(self) -> None:
        queues = await self._queues()
        members = await self._members()
        if self.client_id not in members:
            _log.warning("consumer %s is not (yet) a member of %r", self.client_id, self.group)
            await self._heartbeat()
        topics = (self.topic,) if self._orderly else (self.topic, self.retry_topic)
        target = set(assigned(queues, members, self.client_id, topics, self._max_queues))
        previous, self._last_view = self._last_view, (queues, members)
        lost = [w for q, w in self._workers.items() if q not in target]
        for worker in lost:
            del self._workers[worker.queue]
        for queue in [q for q in self._pending if q not in target]:
            del self._pending[queue]
        if lost:
            _log.info("consumer %s releases %s", self.client_id, [str(w.queue) for w in lost])
            await self._release(lost)
        now = time.monotonic()
        previous_owners = owners_by_topic(*previous) if previous is not None else None
        delay_s = self._options.takeover_delay_ms / 1000
        for queue in sorted(target):
            if queue in self._workers or queue in self._pending:
                continue
            # Orderly: the lock decides when it may be taken (_lock_due).
            gone = self._orderly or owner_gone(queue, self.client_id, previous_owners, members)
            self._pending[queue] = now if gone else now + delay_s
        await self._take_due()

    async def _take_due(self) -> None:
        if self._stopped:
            return
        now = time.monotonic()
        due = sorted(q for q, at in self._pending.items() if at <= now)
        for queue in due:
            del self._pending[queue]
        if self._orderly and due:
            due = await self._lock_due(due)
        if self._stopped:
            return  # shutdown came meanwhile (an orderly lock taken expires)
        for queue in due:
            options = self._options
            settings = (
                options.retry_settings if queue.topic == self.retry_topic else options.settings
            )
            lease = self._leases.get(queue)
            worker = AioQueueWorker(
                queue,
                self._reader,
                settings,
                self._handler,
                lease,
                self.client_id if lease is not None else "",
            )
            self._workers[queue] = worker
            worker.start()
        if due:
            _log.info("consumer %s takes %s", self.client_id, [str(q) for q in due])

    async def _release(self, workers: list[AioQueueWorker]) -> None:
        """Stop the workers; each gets the release timeout to finish its handler and
        commit, then its handler is cancelled (the message stays uncommitted)."""
        for worker in workers:
            worker.stop()
        finished = await asyncio.gather(*(w.join(self._release_s) for w in workers))
        if self._orderly:
            for worker in workers:
                self._leases.pop(worker.queue, None)
            # Their final commits are done: the next holder starts after them.
            await self._locker.unlock(w.queue for w in workers)
        for worker, done in zip(workers, finished, strict=True):
            if not done:
                _log.warning(
                    "the handler on %s did not finish within the release timeout; it was "
                    "cancelled at offset %s, which the group consumes again",
                    worker.queue,
                    worker.position,
                )

    # ---- orderly: queue locks (tide/client/_queue_locks.py)

    def _next_renewal(self, last_s: float) -> float:
        """When the orderly locks are renewed next (never, when not orderly)."""
        if not self._orderly:
            return float("inf")
        return last_s + self._locker.renew_interval_ms(self._lock_interval_ms) / 1000

    async def _lock_due(self, due: list[MessageQueue]) -> list[MessageQueue]:
        """Lock the due queues; those locked get a lease, the others wait (pending
        again) for their holder's unlock or expiry."""
        held, until_s = await self._locker.lock(due)
        retry_at = time.monotonic() + min(self._lock_interval_ms, LOCK_RETRY_MS) / 1000
        for queue in due:
            if queue in held:
                lease = self._leases[queue] = AioQueueLease()
                lease.extend(until_s)
            else:
                self._pending[queue] = retry_at
        waiting = [str(q) for q in due if q not in held]
        if waiting:
            _log.info("consumer %s waits for the locks of %s", self.client_id, waiting)
        return [queue for queue in due if queue in held]

    async def _renew_locks(self) -> None:
        """Renew the locks of the queues consumed (RocketMQ's lockAll)."""
        queues = list(self._leases)
        if not queues:
            return
        held, until_s = await self._locker.lock(queues)
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

"""One assigned queue of a push consumer: a thread that long-polls, delivers and commits.

All commits of a queue happen on its worker thread, so they are ordered; after
``release`` returns, the worker has committed its final position and commits no more.

A commit that fails (e.g. UNAVAILABLE while the broker's master is down: consumer offsets
live on the master, while pulls go on from its slave) keeps the position in memory;
consuming goes on, the failure is logged once per outage, and the commit is tried again
every commit interval (at least MIN_COMMIT_RETRY_MS apart) and on release.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from tide.client._convert import from_pull_response
from tide.client._errors import TideError, error_from_rpc
from tide.client._pull_consumer import GatewayReader
from tide.client._queue_locks import QueueLease
from tide.client._start_offset import ConsumeFrom, start_offset
from tide.client._types import (
    ConsumeResult,
    MessageQueue,
    PullResult,
    PullStatus,
    ReceivedMessage,
)
from tide.v1 import gateway_pb2

_log = logging.getLogger("tide.client.consumer")

MAX_ERROR_BACKOFF_MS = 5_000
# An orderly worker without a valid lease looks again this often (and when renewed).
LEASE_WAIT_S = 0.2
# A failed commit is tried again at most this often (even with commit_interval_ms 0).
MIN_COMMIT_RETRY_MS = 200
MAX_RETRY_BACKOFF_MS = 60_000
# A failed send-back is tried again at most this far apart (unless retry_backoff_ms is
# longer): it failed on an outage (gateway or master down) and the queue stands still
# until it goes through, so the end of the outage must be noticed soon, not one doubled
# wait (up to MAX_RETRY_BACKOFF_MS) later. RocketMQ's consumer tries a failed
# sendMessageBack again after 5 s (ConsumeMessageConcurrentlyService).
MAX_SEND_BACK_RETRY_MS = 5_000
DELAY_BY_POLICY = 0  # SendBack's delay level: the group's retry policy
DEAD_LETTER = -1  # SendBack's delay level: the dead-letter queue at once

Callback = Callable[[ReceivedMessage], object]


@dataclass(frozen=True)
class WorkerSettings:
    group: str
    expression: str
    consume_from: ConsumeFrom
    max_messages: int
    long_poll_timeout_ms: int
    commit_interval_ms: int
    max_retries: int
    retry_backoff_ms: int
    error_backoff_ms: int
    # Orderly: failures are retried here (max_retries), then dead-lettered; otherwise
    # sent back at once. max_reconsume_times: SendBack's (0: the group's config).
    orderly: bool = False
    max_reconsume_times: int = 0
    # Fuller pulls: the gateway holds a pull while its queue has fewer than min_messages
    # past the offset, up to min_messages_wait_ms (0: reads at once).
    min_messages: int = 0
    min_messages_wait_ms: int = 0


def retry_wait_ms(settings: WorkerSettings, failures: int) -> int:
    """The wait before delivering a message again after its ``failures``-th failure."""
    wait = settings.retry_backoff_ms << min(max(0, failures - 1), 32)
    return min(wait, MAX_RETRY_BACKOFF_MS)


def send_back_wait_ms(settings: WorkerSettings, failures: int) -> int:
    """The wait before a send-back is tried again after its ``failures``-th failure:
    doubling from ``retry_backoff_ms``, at most MAX_SEND_BACK_RETRY_MS (or
    ``retry_backoff_ms`` when longer)."""
    ceiling_ms = max(settings.retry_backoff_ms, MAX_SEND_BACK_RETRY_MS)
    return min(retry_wait_ms(settings, failures), ceiling_ms)


def log_failure(queue: MessageQueue, message: ReceivedMessage) -> None:
    """A callback (a handler) raised on ``message``: logged with its traceback."""
    _log.warning(
        "callback failed on %s offset %d (msg id %s, attempt %d)",
        queue,
        message.queue_offset,
        message.msg_id,
        message.attempt,
        exc_info=True,
    )


def consumed(result: object) -> bool:
    """Whether a callback's return value means consumed (all but RECONSUME_LATER)."""
    return result is not ConsumeResult.RECONSUME_LATER


class QueueWorker:
    def __init__(
        self,
        queue: MessageQueue,
        reader: GatewayReader,
        settings: WorkerSettings,
        callback: Callback,
        lease: QueueLease | None = None,
        client_id: str = "",
    ) -> None:
        self.queue = queue
        # Orderly with queue locks (_queue_locks.py): deliver and commit only while the
        # lease is valid; pulls carry the client id (the gateway's lock check).
        self._lease = lease
        self._client_id = client_id
        self._reader = reader
        self._settings = settings
        self._callback = callback
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._pending: grpc.Future[gateway_pb2.PullResponse] | None = None
        # The next offset to deliver (None until the start offset is known).
        self._position: int | None = None
        self._committed = -1
        self._last_commit = time.monotonic()
        # Commits failed since the last one that succeeded (0: none).
        self._commit_failures = 0
        self.delivered = 0
        # Messages sent back for a later attempt, and sent to the dead-letter queue.
        self.sent_back = 0
        self.dead_lettered = 0
        self._thread = threading.Thread(target=self._run, name=f"tide-consume-{queue}", daemon=True)

    @property
    def position(self) -> int | None:
        return self._position

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the worker to stop after the message it is delivering (a pull in flight is
        cancelled)."""
        self._stopping.set()
        with self._lock:
            pending = self._pending
        if pending is not None:
            pending.cancel()

    def join(self, timeout_s: float) -> bool:
        """Wait until the worker has made its final commit; False when it did not in time."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # ---- the thread

    def _run(self) -> None:
        try:
            self._consume()
        except Exception:
            _log.exception("consumer of %s stopped on an unexpected error", self.queue)
        finally:
            self._commit_if_dirty(final=True)

    def _consume(self) -> None:
        caught_up = self._resolve_start()
        if caught_up is None:
            return
        failures = 0
        while not self._stopping.is_set():
            assert self._position is not None
            if caught_up or self._commit_due():
                self._commit_if_dirty(final=False)
            try:
                result = self._pull(self._position)
            except grpc.FutureCancelledError:
                return
            except TideError as exc:
                failures += 1
                wait_ms = min(self._settings.error_backoff_ms * failures, MAX_ERROR_BACKOFF_MS)
                _log.warning("pull from %s failed: %s; again in %d ms", self.queue, exc, wait_ms)
                if self._stopping.wait(wait_ms / 1000):
                    return
                continue
            failures = 0
            if result is None:  # cancelled
                return
            caught_up = self._handle(result)

    def _resolve_start(self) -> bool | None:
        """Find the start offset; whether it is the queue's end (None: stopped first)."""
        failures = 0
        while not self._stopping.is_set():
            try:
                committed = self._reader.committed(self._settings.group, self.queue)
                offsets = self._reader.offsets(self.queue)
                position = start_offset(
                    committed,
                    self._settings.consume_from,
                    offsets.min_offset,
                    offsets.max_offset,
                    lambda ts: self._reader.search_offset(self.queue, ts),
                )
            except TideError as exc:
                failures += 1
                wait_ms = min(self._settings.error_backoff_ms * failures, MAX_ERROR_BACKOFF_MS)
                _log.warning(
                    "start offset of %s unknown: %s; again in %d ms", self.queue, exc, wait_ms
                )
                self._stopping.wait(wait_ms / 1000)
                continue
            self._committed = committed
            self._position = position
            _log.info(
                "consuming %s from offset %d (committed %d, queue %d..%d)",
                self.queue,
                position,
                committed,
                offsets.min_offset,
                offsets.max_offset,
            )
            return position >= offsets.max_offset
        return None

    def _pull(self, offset: int) -> PullResult | None:
        settings = self._settings
        request = self._reader.pull_request(
            settings.group,
            self.queue,
            offset,
            settings.max_messages,
            settings.expression,
            settings.long_poll_timeout_ms,
            min_messages=settings.min_messages,
            min_messages_wait_ms=settings.min_messages_wait_ms,
        )
        request.client_id = self._client_id
        with self._lock:
            if self._stopping.is_set():
                return None
            future = self._reader.pull_future(request)
            self._pending = future
        try:
            response = future.result()
        except grpc.RpcError as exc:
            if future.cancelled():
                return None
            raise error_from_rpc(exc, f"Pull from {self.queue} at {offset}") from exc
        finally:
            with self._lock:
                self._pending = None
        return from_pull_response(self.queue, response)

    def _handle(self, result: PullResult) -> bool:
        """Deliver a pull's messages; True when the queue is drained (caught up)."""
        if result.status is PullStatus.OFFSET_ILLEGAL:
            _log.warning(
                "offset %s of %s is outside %d..%d; continuing at %d",
                self._position,
                self.queue,
                result.min_offset,
                result.max_offset,
                result.next_offset,
            )
            self._position = result.next_offset
            return False
        for message in result.messages:
            if not self._deliver(message):
                return False  # stopping: the position stays at this message
            self._position = message.queue_offset + 1
        if self._stopping.is_set():
            return False
        self._position = result.next_offset
        return result.next_offset >= result.max_offset

    def _deliver(self, message: ReceivedMessage) -> bool:
        """Consume one message; False if asked to stop first (the position stays at it).

        Concurrently (the default): a failure sends the message back to the broker
        (its group's retry topic, or the dead-letter queue past the maximum) and the
        queue moves on. A send-back that fails (the gateway or the broker's master
        down) is tried again with backoff, the message consumed again in between: the
        queue does not move past it until it is consumed or sent back.

        Orderly: the queue is suspended while the message is retried here, up to
        ``max_retries`` times with backoff; past that it is dead-lettered (send-back
        with delay level -1) and the queue moves on."""
        if self._settings.orderly:
            return self._deliver_orderly(message)
        failures = 0
        while not self._stopping.is_set():
            if self._consumed(message):
                self.delivered += 1
                return True
            if self._sent_back(message, DELAY_BY_POLICY):
                return True
            failures += 1
            wait_ms = send_back_wait_ms(self._settings, failures)
            _log.warning(
                "message %s of %s offset %d neither consumed nor sent back yet; consuming "
                "it again in %d ms",
                message.msg_id,
                self.queue,
                message.queue_offset,
                wait_ms,
            )
            if self._stopping.wait(wait_ms / 1000):
                return False
        return False

    def _deliver_orderly(self, message: ReceivedMessage) -> bool:
        failures = 0
        while not self._stopping.is_set():
            if not self._lease_valid():
                continue
            if self._consumed(message):
                self.delivered += 1
                return True
            failures += 1
            if failures > self._settings.max_retries:
                return self._dead_letter(message, failures)
            wait_ms = retry_wait_ms(self._settings, failures)
            _log.warning(
                "callback failed on %s offset %d (attempt %d of %d); again in %d ms",
                self.queue,
                message.queue_offset,
                failures,
                self._settings.max_retries + 1,
                wait_ms,
            )
            if self._stopping.wait(wait_ms / 1000):
                return False
        return False

    def _lease_valid(self) -> bool:
        """True when delivering is allowed now (no lease, or a valid one); else waits a
        little for a renewal (the caller loops until it stops)."""
        lease = self._lease
        return lease is None or lease.valid() or lease.wait_valid(LEASE_WAIT_S)

    def _dead_letter(self, message: ReceivedMessage, failures: int) -> bool:
        """Past the local retries: to the dead-letter queue, tried until it is there
        (False: stopping first)."""
        attempts = 0
        while not self._stopping.is_set():
            if self._sent_back(message, DEAD_LETTER):
                _log.error(
                    "callback failed %d times on %s offset %d (msg id %s); dead-lettered",
                    failures,
                    self.queue,
                    message.queue_offset,
                    message.msg_id,
                )
                return True
            attempts += 1
            if self._stopping.wait(send_back_wait_ms(self._settings, attempts) / 1000):
                return False
        return False

    def _consumed(self, message: ReceivedMessage) -> bool:
        """Call the callback: True unless it raised or asked to reconsume later."""
        try:
            result = self._callback(message)
        except Exception:
            log_failure(self.queue, message)
            return False
        return consumed(result)

    def _sent_back(self, message: ReceivedMessage, delay_level: int) -> bool:
        """One SendBack (one attempt: the caller waits and tries again)."""
        try:
            result = self._reader.send_back(
                self._settings.group,
                message,
                delay_level,
                self._settings.max_reconsume_times,
                single_attempt=True,
            )
        except TideError as exc:
            _log.warning(
                "send-back of %s (%s offset %d) failed: %s",
                message.msg_id,
                self.queue,
                message.queue_offset,
                exc,
            )
            return False
        if result.dead_lettered:
            self.dead_lettered += 1
        else:
            self.sent_back += 1
        return True

    @property
    def commit_failures(self) -> int:
        """Commits that failed since the last one that succeeded."""
        return self._commit_failures

    def _commit_due(self) -> bool:
        elapsed_ms = (time.monotonic() - self._last_commit) * 1000
        return elapsed_ms >= self._settings.commit_interval_ms

    def _commit_if_dirty(self, *, final: bool) -> None:
        position = self._position
        if position is None or position == self._committed:
            return
        if self._lease is not None and not self._lease.valid():
            # Another member may hold the queue by now: its commits, not ours.
            log = _log.warning if final else _log.debug
            log("not committing %s at %d: its lock lapsed", self.queue, position)
            return
        if not final and self._commit_failures:
            # Failing: once per commit interval, not before every pull.
            elapsed_ms = (time.monotonic() - self._last_commit) * 1000
            if elapsed_ms < max(self._settings.commit_interval_ms, MIN_COMMIT_RETRY_MS):
                return
        try:
            if final:
                self._reader.commit(self._settings.group, self.queue, position)
            else:  # one attempt: the next interval tries again
                self._reader.try_commit(self._settings.group, self.queue, position)
        except TideError as exc:
            self._commit_failed(exc, position, final=final)
            return
        if self._commit_failures:
            _log.info(
                "commit of %s at %d succeeded after %d failed attempts",
                self.queue,
                position,
                self._commit_failures,
            )
        self._commit_failures = 0
        self._committed = position
        self._last_commit = time.monotonic()

    def _commit_failed(self, exc: TideError, position: int, *, final: bool) -> None:
        self._commit_failures += 1
        self._last_commit = time.monotonic()
        if final:
            _log.error(
                "final commit of %s at %d failed: %s; the next owner repeats from %d",
                self.queue,
                position,
                exc,
                self._committed,
            )
        elif self._commit_failures == 1:
            _log.warning(
                "commit of %s at %d failed: %s; consuming goes on with the position kept in "
                "memory, and the commit is tried again every %d ms (not logged again until "
                "one succeeds)",
                self.queue,
                position,
                exc,
                max(self._settings.commit_interval_ms, MIN_COMMIT_RETRY_MS),
            )
        else:
            _log.debug("commit of %s at %d failed again: %s", self.queue, position, exc)

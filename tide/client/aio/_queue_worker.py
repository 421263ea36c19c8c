"""One assigned queue of the asyncio push consumer: a task that long-polls, awaits the
handler for each message in queue order, sends failures back and commits.

The sync worker's rules (``tide.client._queue_worker``: its settings, start offset,
send-back backoff): a handler that raises or returns RECONSUME_LATER has its message
sent back (the group's retry topic, or the DLQ past the group's maximum) and the queue
moves on; a send-back that fails is tried again with backoff, the message handled
again in between. Commits are of the next offset to deliver, after the handler
returned: a handler cancelled by ``stop`` leaves its message uncommitted (redelivered
to the next owner)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from tide.client._errors import TideError
from tide.client._pull_consumer import pull_request
from tide.client._queue_worker import (
    DEAD_LETTER,
    DELAY_BY_POLICY,
    LEASE_WAIT_S,
    MAX_ERROR_BACKOFF_MS,
    WorkerSettings,
    consumed,
    log_failure,
    retry_wait_ms,
    send_back_wait_ms,
)
from tide.client._start_offset import start_offset
from tide.client._types import MessageQueue, PullResult, PullStatus, ReceivedMessage
from tide.client.aio._pull_consumer import AioReader
from tide.client.aio._queue_locks import AioQueueLease

_log = logging.getLogger("tide.client.consumer")

# The handler: a coroutine function called with each message.
Handler = Callable[[ReceivedMessage], Awaitable[object]]


class AioQueueWorker:
    def __init__(
        self,
        queue: MessageQueue,
        reader: AioReader,
        settings: WorkerSettings,
        handler: Handler,
        lease: AioQueueLease | None = None,
        client_id: str = "",
    ) -> None:
        self.queue = queue
        # Orderly with queue locks (_queue_locks.py): deliver and commit only while the
        # lease is valid; pulls carry the client id (the gateway's lock check).
        self._lease = lease
        self._client_id = client_id
        self._reader = reader
        self._settings = settings
        self._handler = handler
        self._stopping = asyncio.Event()
        self._pull: asyncio.Task[PullResult] | None = None
        self._task: asyncio.Task[None] | None = None
        self.position: int | None = None  # the next offset to deliver
        self._committed = -1
        self._last_commit = time.monotonic()
        self.delivered = 0
        self.sent_back = 0
        self.dead_lettered = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=str(self.queue))

    def stop(self) -> None:
        """Stop after the message being handled (a pull in flight is cancelled)."""
        self._stopping.set()
        if self._pull is not None:
            self._pull.cancel()

    async def join(self, timeout_s: float) -> bool:
        """Wait for the final commit; past ``timeout_s`` the handler is cancelled (its
        message stays uncommitted). False when it had to be cancelled."""
        assert self._task is not None
        done, _ = await asyncio.wait({self._task}, timeout=timeout_s)
        if done:
            return True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return False

    # ---- the task

    async def _run(self) -> None:
        try:
            await self._consume()
        except asyncio.CancelledError:
            _log.info("consumer of %s cancelled at offset %s", self.queue, self.position)
        except Exception:
            _log.exception("consumer of %s stopped on an unexpected error", self.queue)
        await self._commit(final=True)

    async def _consume(self) -> None:
        if not await self._resolve_start():
            return
        failures = 0
        while not self._stopping.is_set():
            assert self.position is not None
            if self._commit_due():
                await self._commit(final=False)
            try:
                result = await self._pulled(self.position)
            except TideError as exc:
                failures += 1
                wait_ms = min(self._settings.error_backoff_ms * failures, MAX_ERROR_BACKOFF_MS)
                _log.warning("pull from %s failed: %s; again in %d ms", self.queue, exc, wait_ms)
                await self._pause(wait_ms)
                continue
            failures = 0
            if result is None:  # stopping
                return
            await self._handle(result)

    async def _resolve_start(self) -> bool:
        """Find the start offset; False when stopped first."""
        failures = 0
        while not self._stopping.is_set():
            try:
                committed = await self._reader.committed(self._settings.group, self.queue)
                offsets = await self._reader.offsets(self.queue)
                timestamp_ms = self._settings.consume_from.timestamp_ms
                searched = (
                    await self._reader.search_offset(self.queue, timestamp_ms)
                    if committed < 0 and self._settings.consume_from.kind == "timestamp"
                    else 0
                )
            except TideError as exc:
                failures += 1
                wait_ms = min(self._settings.error_backoff_ms * failures, MAX_ERROR_BACKOFF_MS)
                _log.warning("start offset of %s unknown: %s", self.queue, exc)
                await self._pause(wait_ms)
                continue
            self._committed = committed
            self.position = start_offset(
                committed,
                self._settings.consume_from,
                offsets.min_offset,
                offsets.max_offset,
                lambda _ts, found=searched: found,  # type: ignore[misc]
            )
            return True
        return False

    async def _pulled(self, offset: int) -> PullResult | None:
        """One (long-polling) pull; None when ``stop`` cancelled it."""
        s = self._settings
        request = pull_request(
            s.group,
            self.queue,
            offset,
            s.max_messages,
            s.expression,
            s.long_poll_timeout_ms,
            min_messages=s.min_messages,
            min_messages_wait_ms=s.min_messages_wait_ms,
        )
        request.client_id = self._client_id
        self._pull = asyncio.get_running_loop().create_task(self._reader.pull(request, self.queue))
        try:
            await asyncio.wait({self._pull})
        finally:
            if not self._pull.done():  # this task cancelled: the pull goes too
                self._pull.cancel()
        pull, self._pull = self._pull, None
        return None if pull.cancelled() else pull.result()

    async def _handle(self, result: PullResult) -> None:
        if result.status is PullStatus.OFFSET_ILLEGAL:
            _log.warning(
                "offset %s of %s is outside %d..%d; continuing at %d",
                self.position,
                self.queue,
                result.min_offset,
                result.max_offset,
                result.next_offset,
            )
            self.position = result.next_offset
            return
        for message in result.messages:
            if not await self._deliver(message):
                return  # stopping: the position stays at this message
            self.position = message.queue_offset + 1
        if not self._stopping.is_set():
            self.position = result.next_offset
            if result.next_offset >= result.max_offset:  # drained: commit now
                await self._commit(final=False)

    async def _deliver(self, message: ReceivedMessage) -> bool:
        """Handle one message, or send it back; False when stopping first."""
        if self._settings.orderly:
            return await self._deliver_orderly(message)
        failures = 0
        while not self._stopping.is_set():
            if await self._handled(message):
                self.delivered += 1
                return True
            if await self._sent_back(message, DELAY_BY_POLICY):
                return True
            failures += 1
            await self._pause(send_back_wait_ms(self._settings, failures))
        return False

    async def _deliver_orderly(self, message: ReceivedMessage) -> bool:
        """Orderly: while the lease is valid, handle the message; a failure is retried
        here (the queue waits) up to ``max_retries`` times, then dead-lettered."""
        failures = 0
        while not self._stopping.is_set():
            if self._lease is not None and not self._lease.valid():
                await self._lease.wait_valid(LEASE_WAIT_S)
                continue
            if await self._handled(message):
                self.delivered += 1
                return True
            failures += 1
            if failures > self._settings.max_retries:
                return await self._dead_letter(message, failures)
            wait_ms = retry_wait_ms(self._settings, failures)
            _log.warning(
                "handler failed on %s offset %d (attempt %d of %d); again in %d ms",
                self.queue,
                message.queue_offset,
                failures,
                self._settings.max_retries + 1,
                wait_ms,
            )
            await self._pause(wait_ms)
        return False

    async def _dead_letter(self, message: ReceivedMessage, failures: int) -> bool:
        """Past the local retries: to the dead-letter queue, tried until it is there
        (False: stopping first)."""
        attempts = 0
        while not self._stopping.is_set():
            if await self._sent_back(message, DEAD_LETTER):
                _log.error(
                    "handler failed %d times on %s offset %d (msg id %s); dead-lettered",
                    failures,
                    self.queue,
                    message.queue_offset,
                    message.msg_id,
                )
                return True
            attempts += 1
            await self._pause(send_back_wait_ms(self._settings, attempts))
        return False

    async def _handled(self, message: ReceivedMessage) -> bool:
        try:
            result = await self._handler(message)
        except Exception:
            log_failure(self.queue, message)
            return False
        return consumed(result)

    async def _sent_back(self, message: ReceivedMessage, delay_level: int) -> bool:
        s = self._settings
        try:
            result = await self._reader.send_back(
                s.group, message, delay_level, s.max_reconsume_times, retry=False
            )
        except TideError as exc:
            _log.warning("send-back of %s (%s) failed: %s", message.msg_id, self.queue, exc)
            return False
        if result.dead_lettered:
            self.dead_lettered += 1
        else:
            self.sent_back += 1
        return True

    async def _pause(self, wait_ms: int) -> None:
        """Wait ``wait_ms``, or less when stopping."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_ms / 1000):
                await self._stopping.wait()

    def _commit_due(self) -> bool:
        elapsed_ms = (time.monotonic() - self._last_commit) * 1000
        return elapsed_ms >= self._settings.commit_interval_ms

    async def _commit(self, *, final: bool) -> None:
        """Commit the position when it moved: one attempt while consuming (the next
        interval tries again), with retries at the end."""
        position = self.position
        if position is None or position == self._committed:
            return
        if self._lease is not None and not self._lease.valid():
            # Another member may hold the queue by now: its commits, not ours.
            log = _log.warning if final else _log.debug
            log("not committing %s at %d: its lock lapsed", self.queue, position)
            return
        self._last_commit = time.monotonic()
        try:
            await self._reader.commit(self._settings.group, self.queue, position, retry=final)
        except TideError as exc:
            log = _log.error if final else _log.warning
            log("commit of %s at %d failed: %s", self.queue, position, exc)
            return
        self._committed = position

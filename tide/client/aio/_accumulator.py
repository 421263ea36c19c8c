"""The asyncio producer's accumulator: the sync client's batching rules
(``tide.client._batching``) on the event loop.

A sender task hands each due batch to a call task (at most ``max_calls`` at once, the
sync client's ``async_threads``). Each message has a :class:`Delivery`, the future of its
outcome, which cannot be cancelled once its batch has left: a message is either
withdrawn before its call (never sent) or gets the gateway's answer, never something in
between. When the loop stops under the producer (``asyncio.run`` ending with the producer
open), the tasks' cancellation fails every unanswered delivery with Unavailable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tide.client._batching import (
    IDLE_WAIT_S,
    Batch,
    Batches,
    Entry,
    Limits,
    outcomes,
    request_of,
    should_split,
)
from tide.client._errors import TideError, Unavailable
from tide.client._types import Message, SendResult
from tide.client.aio._in_flight import AioInFlight
from tide.v1 import gateway_pb2

_log = logging.getLogger("tide.client.producer")

Carrier = Callable[[gateway_pb2.ProduceRequest, str], Awaitable[gateway_pb2.ProduceResponse]]
Unpack = Callable[[list[Message], gateway_pb2.ProduceResponse, str], list[SendResult]]

LOOP_STOPPED = (
    "the event loop stopped (or the producer gave up closing) before the send was "
    "answered; close the producer before its loop ends"
)


class Delivery(asyncio.Future[SendResult]):
    """The outcome of one accumulated message: its SendResult or its error.

    ``cancel()`` withdraws the message while its batch has not left (it is then never
    sent) and returns False afterwards: the gateway's answer is coming. ``sent`` says
    whether its batch's call was made."""

    sent = False

    def cancel(self, msg: object = None) -> bool:
        if self.sent:
            return False
        return super().cancel(msg)


def withdraw_or_report(future: asyncio.Future[Any], cancelled: BaseException) -> None:
    """The caller of a send was cancelled: withdraw its message while its batch has not
    left, else hang the send's future on the CancelledError (its outcome is coming)."""
    if isinstance(future, Delivery) and future.cancel():
        return
    cancelled.delivery = future  # type: ignore[attr-defined]


class _AioEntry(Entry):
    __slots__ = ("delivery", "message")

    def __init__(
        self, message: Message, produce: gateway_pb2.ProduceMessage, delivery: Delivery
    ) -> None:
        super().__init__(message.topic, produce)
        self.message = message
        self.delivery = delivery


class AioAccumulator:
    def __init__(
        self,
        limits: Limits,
        in_flight: AioInFlight,
        carry: Carrier,
        unpack: Unpack,
        *,
        timeout_s: float,
    ) -> None:
        self._limits = limits
        self._in_flight = in_flight
        self._carry = carry
        self._unpack = unpack
        self._timeout_s = timeout_s  # the longest a send waits for in-flight room
        self._batches: Batches[_AioEntry] = Batches(limits)
        self._calls: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._closing = False
        self._sender: asyncio.Task[None] | None = None
        self.calls_sent = 0  # Produce calls made (tests, diagnostics)
        self.messages_sent = 0

    async def add(self, message: Message, produce: gateway_pb2.ProduceMessage) -> Delivery:
        """Queue one checked message once there is in-flight room (backpressure:
        ResourceExhausted after the RPC timeout)."""
        entry = _AioEntry(message, produce, Delivery())
        self._check_open()
        size = entry.size_bytes
        await self._in_flight.acquire(size, self._timeout_s, "send")
        if self._closing:
            self._in_flight.release(size)
            self._check_open()
        entry.delivery.add_done_callback(lambda _: self._in_flight.release(size))
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._run())
        if self._batches.add(entry):  # else it joined a batch the sender already times
            self._wake.set()
            # Let the sender take a full batch now: a caller adding in a loop without
            # awaiting anything else would otherwise fill max_in_flight before any goes.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError as cancelled:
                withdraw_or_report(entry.delivery, cancelled)
                raise
        return entry.delivery

    def _check_open(self) -> None:
        if self._closing:
            raise TideError("the producer is closed")

    async def close(self, timeout_s: float) -> None:
        """Send what is queued now (no linger) and wait up to ``timeout_s`` for the
        answers; what is unanswered then fails with Unavailable."""
        self._closing = True
        self._wake.set()
        sender = self._sender
        if sender is None or sender.done():
            return
        done, _ = await asyncio.wait({sender}, timeout=timeout_s)
        if not done:
            _log.warning("the producer's sends were not all answered when it closed")
            for task in (*self._calls, sender):
                task.cancel()
            await asyncio.gather(*self._calls, sender, return_exceptions=True)

    # -- the sender task --------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while (batch := await self._next_batch()) is not None:
                self._send(batch)
        except asyncio.CancelledError:
            self._fail_all(Unavailable(f"Produce: {LOOP_STOPPED}"))
            raise
        except BaseException as exc:  # a bug here must not leave sends waiting forever
            _log.error("the producer's sender failed", exc_info=exc)
            self._fail_all(exc)

    async def _next_batch(self) -> Batch[_AioEntry] | None:
        """The next batch to send once a call is free; None when closed and all done."""
        while True:
            if self._closing and self._batches.idle and not self._calls:
                return None
            wait_s = IDLE_WAIT_S
            if len(self._calls) < self._limits.max_calls:
                batch, wait_s = self._batches.due(time.monotonic(), closing=self._closing)
                if batch is not None:
                    return batch
            self._wake.clear()
            try:
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _send(self, batch: Batch[_AioEntry]) -> None:
        # A delivery cancelled before its batch left: withdrawn, not sent.
        entries = [e for e in batch.entries if not e.delivery.done()]
        if not entries:
            return
        for entry in entries:
            entry.delivery.sent = True
        self.calls_sent += 1
        self.messages_sent += len(entries)
        task = asyncio.get_running_loop().create_task(self._call(batch, entries))
        self._calls.add(task)
        task.add_done_callback(self._call_done)

    def _call_done(self, task: asyncio.Task[None]) -> None:
        self._calls.discard(task)
        self._wake.set()

    async def _call(self, batch: Batch[_AioEntry], entries: list[_AioEntry]) -> None:
        what = batch.what
        error: BaseException | None = None
        try:
            answer = await self._carry(request_of(entries), what)
        except asyncio.CancelledError:
            _settle(entries, Unavailable(f"{what}: {LOOP_STOPPED}; stored or not"))
            raise
        except TideError as exc:
            error = exc
        if should_split(batch, entries, error):
            for entry in entries:
                entry.delivery.sent = False  # they go again, each alone
            self._batches.split(batch.topic, entries)
            return
        if error is not None:
            _settle(entries, error)
            return
        try:
            results = self._unpack([e.message for e in entries], answer, what)
        except TideError as exc:
            _settle(entries, exc)
            return
        for entry, outcome in zip(entries, outcomes(results), strict=True):
            if isinstance(outcome, TideError):
                entry.delivery.set_exception(outcome)
            else:
                entry.delivery.set_result(outcome)

    def _fail_all(self, error: BaseException) -> None:
        self._closing = True
        for batch in self._batches.drain():
            _settle(batch.entries, error)


def _settle(entries: list[_AioEntry], error: BaseException) -> None:
    for entry in entries:
        if not entry.delivery.done():
            entry.delivery.set_exception(error)

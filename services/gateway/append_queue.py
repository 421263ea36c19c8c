"""Appends to one storage, coalesced: few calls in flight, the groups that wait go together.

Every ``Storage.Append`` costs the storage (and the gateway) a fixed amount of gRPC work
besides the per-message work, so under load the gateway sends fewer, larger calls: at
most ``max_in_flight`` Appends to one storage at once; the groups of messages that
arrive meanwhile wait, and the next call carries all of them (up to ``max_messages``
messages and ``max_bytes``). Nothing waits on a timer: with a call slot free a group
is sent at once, so a lightly loaded gateway adds no latency.

A group of one plain message (``SMALL_GROUP_MAX_MESSAGES``) may also take one of
``small_in_flight`` extra call slots when nothing waits and no call of a lone message is
in flight: a single message does not wait behind a batch's append (~0.6 ms of a ~4 ms
call, docs/performance.md "One call's serial path"), while single messages from a few
callers (issue 21 target 3: 4 in flight) still wait for each other's call and go
together in the next one, as the ceiling's relay joins them: fewer appends, Tail chunks
and pulls behind them (docs/performance.md "Single messages coalesce with each other").
Groups of several messages, idempotent ones (their order matters to the storage's
sequence checks) and groups arriving while others wait keep the coalescing slots.

Each group is kept as its serialized ``AppendRequest``; requests concatenate into one
(a repeated field's entries simply follow each other), and each group gets the response
with the range of its entries (results or record columns), in the same order. The
storage validates a whole batch before writing any of it, so when a coalesced call
fails for a reason of its own (INVALID_ARGUMENT, NOT_FOUND, ...), nothing was written
and every group is sent again on its own: one producer's bad message never fails
another's. A failure to reach the storage fails every group of the call (they are
retried elsewhere by the producer).

Requests of idempotent producers (``AppendRequest.producer_runs``: one entry per
``records`` entry) concatenate only with each other, as plain requests do with plain
ones (``kind``): a concatenation of both would pair the producer fields with the wrong
runs. A call takes the waiting groups in order while they are of its first group's kind.
When a batch of a coalesced idempotent call is a retry the storage writes nothing and
answers ABORTED, and each group is sent on its own, as for any failure of its own.

The queue does not know how a call travels: ``RawAppend`` is given by brokers.py, which
sends it over one of the storage's AppendStream streams (append_streams.py; one stream
per call slot) or, inside a sampled trace, as a unary ``Append``.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc

from tide.v1 import storage_pb2 as storage_pb

# (serialized AppendRequest, timeout) -> AppendResponse
RawAppend = Callable[[bytes, float], Coroutine[Any, Any, storage_pb.AppendResponse]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The response of the call that carried a group, where the group's entries are in
    it (``results`` or the record columns), and the call's latency."""

    response: storage_pb.AppendResponse
    start: int
    end: int
    latency_ms: float


# Answers meaning "the broker is not reachable (now)" (brokers.py exports it too).
UNREACHABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    }
)
# Appends in flight to one storage: the default, and the most --appends-in-flight allows.
# One measured best on 2 cores (2026-11-22, docs/benchmarks.md "Gateway"): the produces
# that arrive while it is in flight go together in the next call, so the storage and
# the dispatch behind it see fewer, larger appends (unary 91-97 k -> 106 k msgs/s).
DEFAULT_APPENDS_IN_FLIGHT = 1
MAX_APPENDS_IN_FLIGHT = 16
# Call slots a lone single-message group may take besides --appends-in-flight (brokers.py
# gives this; the queue's default is none), and what counts as such a group. One: a
# second lone message waits for the first's call and coalesces with those behind it.
SMALL_APPENDS_IN_FLIGHT = 1
SMALL_GROUP_MAX_MESSAGES = 1
MAX_COALESCED_MESSAGES = 2_000
MAX_COALESCED_BYTES = 4 << 20
# What a group's serialized AppendRequest carries (only groups of one kind concatenate).
PLAIN = 0  # records (or messages)
PRODUCER_RUNS = 1  # records with producer_runs: idempotent producers' batches


@dataclass(slots=True)
class _Waiting:
    data: bytes
    count: int
    future: asyncio.Future[Outcome]
    kind: int
    # The caller's context: a coalesced call is sent in its first group's, so the Append
    # continues that produce's trace (tracing) rather than whichever call finished last.
    context: contextvars.Context


class AppendQueue:
    def __init__(
        self,
        append: RawAppend,
        limit: asyncio.Semaphore,
        *,
        max_in_flight: int = DEFAULT_APPENDS_IN_FLIGHT,
        max_messages: int = MAX_COALESCED_MESSAGES,
        max_bytes: int = MAX_COALESCED_BYTES,
        small_in_flight: int = 0,
    ) -> None:
        self._append = append
        self._limit = limit
        self._max_in_flight = max_in_flight
        self._max_small_in_flight = max_in_flight + small_in_flight
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._in_flight = 0
        self._lone_calls = 0  # calls in flight carrying a lone message (any slot)
        self._waiting: deque[_Waiting] = deque()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def append(
        self, data: bytes, count: int, timeout_s: float, *, kind: int = PLAIN
    ) -> Outcome:
        """Append the serialized request ``data`` of ``count`` messages (or records) of
        ``kind`` (PLAIN or PRODUCER_RUNS); raises the call's ``grpc.aio.AioRpcError``."""
        if not self._waiting and (
            self._in_flight < self._max_in_flight
            or (
                self._in_flight < self._max_small_in_flight
                and count <= SMALL_GROUP_MAX_MESSAGES
                and kind == PLAIN
                and not self._lone_calls
            )
        ):
            self._in_flight += 1
            try:
                return await self._call(data, count, timeout_s)
            finally:
                self._in_flight -= 1
                self._next(timeout_s)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(data, count, future, kind, contextvars.copy_context()))
        return await future

    async def _call(self, data: bytes, count: int, timeout_s: float) -> Outcome:
        lone = count <= SMALL_GROUP_MAX_MESSAGES
        self._lone_calls += lone
        try:
            async with self._limit:
                started = time.monotonic()  # the broker's latency, not the wait for a turn
                response = await self._append(data, timeout_s)
        finally:
            self._lone_calls -= lone
        return Outcome(response, 0, count, (time.monotonic() - started) * 1000)

    def _next(self, timeout_s: float) -> None:
        """Send what waits, while a call slot is free."""
        while self._waiting and self._in_flight < self._max_in_flight:
            batch: list[_Waiting] = []
            messages = size = 0
            while self._waiting:
                first = self._waiting[0]
                if first.future.done():  # its caller went away (cancelled)
                    self._waiting.popleft()
                    continue
                if batch and (
                    first.kind != batch[0].kind
                    or messages + first.count > self._max_messages
                    or size + len(first.data) > self._max_bytes
                ):
                    break
                batch.append(self._waiting.popleft())
                messages += first.count
                size += len(first.data)
            if not batch:
                return
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(
                self._send(batch, timeout_s), context=batch[0].context.copy()
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Waiting], timeout_s: float) -> None:
        try:
            await self._send_batch(batch, timeout_s)
        finally:
            self._in_flight -= 1
            self._next(timeout_s)

    async def _send_batch(self, batch: list[_Waiting], timeout_s: float) -> None:
        data = batch[0].data if len(batch) == 1 else b"".join(item.data for item in batch)
        total = sum(item.count for item in batch)
        try:
            outcome = await self._call(data, total, timeout_s)
        except grpc.aio.AioRpcError as exc:
            if len(batch) > 1 and exc.code() not in UNREACHABLE:
                await asyncio.gather(*(self._send_alone(item, timeout_s) for item in batch))
                return
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        except BaseException as exc:  # e.g. the gateway stopping: never leave a caller hanging
            for item in batch:
                if not item.future.done():
                    if isinstance(exc, asyncio.CancelledError):
                        item.future.cancel()
                    else:
                        item.future.set_exception(exc)
            raise
        start = 0
        for item in batch:
            end = start + item.count
            if not item.future.done():
                item.future.set_result(Outcome(outcome.response, start, end, outcome.latency_ms))
            start = end

    async def _send_alone(self, item: _Waiting, timeout_s: float) -> None:
        if item.future.done():
            return
        try:
            outcome = await self._call(item.data, item.count, timeout_s)
        except grpc.aio.AioRpcError as exc:
            if not item.future.done():
                item.future.set_exception(exc)
            return
        if not item.future.done():
            item.future.set_result(outcome)

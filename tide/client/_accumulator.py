"""A producer's accumulator: single sends from many threads share Produce calls.

Kafka's ``linger.ms`` / ``batch.size`` and RocketMQ's autoBatch: each ``send`` or
``send_async`` adds its message to its topic's open batch and gets a future. One sender
thread hands a batch to a carrier (a unary call on the producer's threads, or a request
on its ProduceStream) when the batch is full (``batch_max_messages``, or
``batch_max_bytes``: a message that does not fit starts the next batch, one larger than
that goes alone), or ``linger_ms`` after its first message, and while fewer than
``max_calls`` of its calls are unanswered; until then the batch keeps filling. A lone
message therefore waits at most ``linger_ms`` (plus a free call). Batches holding
messages of blocking ``send()`` calls go sooner: as soon as every ``send()`` under way
waits in an open batch, since no caller is then on its way to join them (lingering
would only hold the callers; docs/performance.md measures it).

Why batches are per topic: the gateway routes each message by itself (explicit queue,
sharding key, or the topic's next round robin queue for the rest of its topic in the
call), so messages of one topic with any routing can share a call; a refusal about a
topic (it does not exist, its type) then concerns every message of the call alike.

Each message keeps its exact outcome: the call's per-message results go to their own
futures (a message not written fails its future with its own error, as ``send`` raises);
a call that fails fails each future with that error; a call refused because of one
message (the gateway checks every message before writing any, and names it:
``messages[i]``) is sent again message by message, so each gets the answer it would
have had alone. Futures cancelled before their batch goes are not sent.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import grpc

from tide.client._errors import InvalidArgument, TideError, Unavailable
from tide.client._in_flight import InFlight
from tide.client._rpc import MAX_SEND_BYTES
from tide.client._types import Message, SendResult
from tide.v1 import gateway_pb2

_log = logging.getLogger("tide.client.producer")

# A carrier: send one request, the future holds the answer or the TideError.
Carrier = Callable[[gateway_pb2.ProduceRequest, str], "Future[gateway_pb2.ProduceResponse]"]
# The per-message results of a call (raises TideError when the answer does not fit).
Unpack = Callable[[list[Message], gateway_pb2.ProduceResponse, str], list[SendResult]]

# The sender wakes at least this often (a bound on its waits; it is woken sooner).
_IDLE_WAIT_S = 1.0
# A refusal that names one message of the request: the gateway wrote none of them.
_NAMES_MESSAGE = re.compile(r"\bmessages\[\d+\]")
_REFUSALS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND})
# ProduceRequest.messages is field 1: a one-byte key and the length (up to 5 bytes).
_FIELD_OVERHEAD_BYTES = 6


class _Entry:
    __slots__ = ("future", "message", "produce", "running", "size_bytes")

    def __init__(
        self, message: Message, produce: gateway_pb2.ProduceMessage, size_bytes: int
    ) -> None:
        self.message = message
        self.produce = produce
        self.size_bytes = size_bytes
        self.future: Future[SendResult] = Future()
        self.running = False  # its future marked running (a split send goes again)

    def start(self) -> bool:
        """Mark the future running; False when it was cancelled (not sent, then)."""
        if not self.running:
            self.running = self.future.set_running_or_notify_cancel()
        return self.running


class _Batch:
    __slots__ = ("entries", "size_bytes", "splittable", "started_s", "synced", "topic")

    def __init__(self, topic: str, *, splittable: bool = True) -> None:
        self.topic = topic
        self.entries: list[_Entry] = []
        self.size_bytes = 0
        self.synced = 0  # its entries whose sender waits in send()
        self.started_s = time.monotonic()
        self.splittable = splittable


class Limits:
    """The accumulator's bounds (checked by the Producer)."""

    __slots__ = ("batch_max_bytes", "batch_max_messages", "linger_s", "max_calls")

    def __init__(
        self, linger_ms: int, batch_max_messages: int, batch_max_bytes: int, max_calls: int
    ) -> None:
        self.linger_s = linger_ms / 1000
        self.batch_max_messages = batch_max_messages
        self.batch_max_bytes = batch_max_bytes
        self.max_calls = max_calls


class Accumulator:
    """Collects single sends into per-topic batches; one sender thread hands them out."""

    def __init__(
        self,
        limits: Limits,
        in_flight: InFlight,
        carry: Carrier,
        unpack: Unpack,
        *,
        timeout_s: float,
        close_timeout_s: float,
    ) -> None:
        self._limits = limits
        self._in_flight = in_flight
        self._carry = carry
        self._unpack = unpack
        self._timeout_s = timeout_s  # the longest a send waits for in-flight room
        self._close_timeout_s = close_timeout_s  # the longest close waits for answers
        self._changed = threading.Condition()
        self._open: dict[str, _Batch] = {}
        self._ready: collections.deque[_Batch] = collections.deque()
        self._calls = 0
        self._closing = False
        self._sender: threading.Thread | None = None
        # When the sender's wait ends (0: it is not waiting): a new batch whose linger
        # ends later needs no wake-up. Sends from many threads used to wake the sender
        # once per message, each time to find nothing to do yet.
        self._wake_s = 0.0
        # send() calls under way (from their start until they return) and how many of
        # them wait in an open batch: when all do, no send() is on its way to join them
        self._sync_sends = 0
        self._sync_open = 0
        self.calls_sent = 0  # Produce calls made (tests, diagnostics)
        self.sender_wakeups = 0  # the sender's waits that ended (tests, diagnostics)
        self.messages_sent = 0

    @contextlib.contextmanager
    def sync_send(self) -> Iterator[None]:
        """Around a blocking send() (its message built and added inside, then awaited):
        while every send() under way waits in an open batch, those batches go without
        waiting out their linger (no send() is on its way to join them)."""
        with self._changed:
            self._sync_sends += 1
        try:
            yield
        finally:
            with self._changed:
                self._sync_sends -= 1
                if self._sync_open and self._sync_open == self._sync_sends:
                    self._changed.notify()

    def add(
        self, message: Message, produce: gateway_pb2.ProduceMessage, *, synced: bool = False
    ) -> Future[SendResult]:
        """Queue one checked message (``synced``: its sender waits for it inside
        ``sync_send``); waits while the in-flight bound is reached (ResourceExhausted
        after the RPC timeout)."""
        size = produce.ByteSize() + _FIELD_OVERHEAD_BYTES
        if size > MAX_SEND_BYTES:  # what send_batch refuses too
            raise InvalidArgument(
                f"a message of {size} bytes; the gateway takes requests up to "
                f"{MAX_SEND_BYTES} bytes: send a smaller message"
            )
        entry = _Entry(message, produce, size)
        self._in_flight.acquire(size, self._timeout_s, "send")
        entry.future.add_done_callback(lambda _: self._in_flight.release(size))
        try:
            self._add(entry, synced)
        except BaseException as exc:
            entry.future.set_exception(exc)  # releases the in-flight room
            raise
        return entry.future

    def _add(self, entry: _Entry, synced: bool) -> None:
        limits = self._limits
        topic = entry.message.topic
        with self._changed:
            if self._closing:
                raise TideError("the producer is closed")
            wake = False  # only what changes the sender's next step wakes it
            batch = self._open.get(topic)
            if batch is not None and batch.size_bytes + entry.size_bytes > limits.batch_max_bytes:
                self._make_ready(topic)  # this one starts the next
                batch, wake = None, True
            if batch is None:
                batch = self._open[topic] = _Batch(topic)
                wake = wake or batch.started_s + limits.linger_s < self._wake_s
            batch.entries.append(entry)
            batch.size_bytes += entry.size_bytes
            if synced:
                batch.synced += 1
                self._sync_open += 1
                wake = wake or self._sync_open == self._sync_sends
            full = batch.size_bytes >= limits.batch_max_bytes  # a larger message goes alone
            if full or len(batch.entries) >= limits.batch_max_messages:
                self._make_ready(topic)
                wake = True
            self._start_sender()
            if wake:
                self._changed.notify()

    def _make_ready(self, topic: str) -> _Batch:
        """Close ``topic``'s open batch: it goes next (under the lock)."""
        batch = self._open.pop(topic)
        self._sync_open -= batch.synced
        self._ready.append(batch)
        return batch

    def _start_sender(self) -> None:
        if self._sender is None:
            self._sender = threading.Thread(
                target=self._run, name="tide-producer-sender", daemon=True
            )
            self._sender.start()

    def close(self) -> None:
        """Send what is queued now (no linger) and wait for the answers."""
        with self._changed:
            self._closing = True
            sender = self._sender
            self._changed.notify()
        if sender is None:
            return
        sender.join(self._close_timeout_s)
        if sender.is_alive():
            _log.warning("the producer's sends were not all answered when it closed")
            self._fail_all(Unavailable("the producer closed before the send was answered"))

    # -- the sender thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            while (batch := self._next_batch()) is not None:
                self._send(batch)
        except BaseException as exc:  # a bug here must not leave sends waiting forever
            _log.error("the producer's sender failed", exc_info=exc)
            self._fail_all(exc)

    def _next_batch(self) -> _Batch | None:
        """The next batch to send once a call is free; None when closed and all done."""
        with self._changed:
            while True:
                idle = not self._open and not self._ready
                if self._closing and idle and self._calls == 0:
                    return None
                wait_s = _IDLE_WAIT_S
                now_s = time.monotonic()
                free = self._calls < self._limits.max_calls
                if free:
                    batch, wait_s = self._due(now_s)
                    if batch is not None:
                        self._calls += 1
                        return batch
                # waiting for a free call, a new batch's linger does not matter (an answer
                # wakes it)
                self._wake_s = now_s + wait_s if free else 0.0
                self._changed.wait(wait_s)
                self._wake_s = 0.0  # awake: a sender will look at every batch anyway
                self.sender_wakeups += 1

    def _due(self, now_s: float) -> tuple[_Batch | None, float]:
        """A full batch, else the oldest open one past its linger (all when closing);
        else how long until the first linger ends. Batches that every send() under way
        waits in go at once: lingering would only hold those callers."""
        if self._sync_open and self._sync_open == self._sync_sends:
            for batch in [b for b in self._open.values() if b.synced]:
                self._make_ready(batch.topic)
        if self._ready:
            return self._ready.popleft(), 0.0
        if not self._open:
            return None, _IDLE_WAIT_S
        oldest = min(self._open.values(), key=lambda b: b.started_s)
        left_s = oldest.started_s + self._limits.linger_s - now_s
        if left_s <= 0 or self._closing:
            self._make_ready(oldest.topic)
            return self._ready.popleft(), 0.0
        return None, min(left_s, _IDLE_WAIT_S)

    def _send(self, batch: _Batch) -> None:
        entries = [e for e in batch.entries if e.start()]
        if not entries:
            self._call_done()
            return
        what = f"Produce to {batch.topic!r}"
        request = gateway_pb2.ProduceRequest(
            messages=[e.produce for e in entries], compact_results=True
        )
        self.calls_sent += 1
        self.messages_sent += len(entries)
        try:
            answer = self._carry(request, what)
        except BaseException as exc:  # closed under it: each send gets the reason
            self._call_done()
            for entry in entries:
                entry.future.set_exception(exc)
            return
        answer.add_done_callback(lambda done: self._answered(batch, entries, done, what))

    # -- answers (on the carrier's thread) ----------------------------------------------

    def _answered(
        self,
        batch: _Batch,
        entries: list[_Entry],
        done: Future[gateway_pb2.ProduceResponse],
        what: str,
    ) -> None:
        error = done.exception()
        if error is not None and batch.splittable and len(entries) > 1 and _names_one(error):
            self._split(batch.topic, entries)  # before the call is freed: they go next
            self._call_done()
            return
        self._call_done()
        if error is not None:
            for entry in entries:
                entry.future.set_exception(error)
            return
        try:
            results = self._unpack([e.message for e in entries], done.result(), what)
        except TideError as exc:
            for entry in entries:
                entry.future.set_exception(exc)
            return
        for entry, result in zip(entries, results, strict=True):
            if result.written:
                entry.future.set_result(result)
            else:  # send's rule: a message not written raises, with its own error
                entry.future.set_exception(
                    TideError(f"send to {result.queue.topic!r} failed: {result.error}")
                )

    def _split(self, topic: str, entries: list[_Entry]) -> None:
        """Queue each message of a refused call alone, first in line."""
        with self._changed:
            for entry in reversed(entries):
                single = _Batch(topic, splittable=False)
                single.entries.append(entry)
                single.size_bytes = entry.size_bytes
                self._ready.appendleft(single)

    def _call_done(self) -> None:
        with self._changed:
            self._calls -= 1
            self._changed.notify()  # the sender is the only one waiting

    def _fail_all(self, error: BaseException) -> None:
        with self._changed:
            batches = list(self._ready) + list(self._open.values())
            self._ready.clear()
            self._open.clear()
            self._sync_open = 0
            self._closing = True
        for batch in batches:
            for entry in batch.entries:
                if entry.start():
                    entry.future.set_exception(error)


def _names_one(error: BaseException) -> bool:
    """A refusal about one message of the call (nothing of it was written)."""
    return (
        isinstance(error, TideError)
        and error.code in _REFUSALS
        and _NAMES_MESSAGE.search(error.message) is not None
    )

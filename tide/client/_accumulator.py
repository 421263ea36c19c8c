"""A producer's accumulator: single sends from many threads share Produce calls.

Kafka's ``linger.ms`` / ``batch.size`` and RocketMQ's autoBatch: each ``send`` or
``send_async`` adds its message to its topic's open batch; ``send_async`` gets a future,
a blocking ``send`` waits on a lock its batch's answer releases (cheaper to wake for 16
waiting threads than a Future: docs/performance.md). One sender
thread hands a batch to a carrier (a unary call on the producer's threads, or a request
on its ProduceStream) when the batch is full (``batch_max_messages``, or
``batch_max_bytes``: a message that does not fit starts the next batch, one larger than
that goes alone), or ``linger_ms`` after its first message, and while fewer than
``max_calls`` of its calls are unanswered; until then the batch keeps filling. A lone
message therefore waits at most ``linger_ms`` (plus a free call). Batches holding
messages of blocking ``send()`` calls go sooner: as soon as every ``send()`` under way
waits in an open batch, since no caller is then on its way to join them (lingering
would only hold the callers; docs/performance.md measures it); and while every other
``send()`` under way is on its way (none in an unanswered call, none waiting for
in-flight room), such a batch waits for them, not for its linger. The rules themselves are
``tide.client._batching``'s, shared with the asyncio producer.

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

import _thread
import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from tide.client._batching import (
    IDLE_WAIT_S,
    OPENED,
    READY,
    Batch,
    Batches,
    Entry,
    Limits,
    outcomes,
    request_of,
    should_split,
)
from tide.client._errors import TideError, Unavailable
from tide.client._in_flight import InFlight
from tide.client._types import SendResult
from tide.v1 import gateway_pb2

__all__ = ["Accumulator", "Limits"]

_log = logging.getLogger("tide.client.producer")

# A carrier: send one request, the future holds the answer or the TideError.
Carrier = Callable[[gateway_pb2.ProduceRequest, str], "Future[gateway_pb2.ProduceResponse]"]
# The per-message results of a call, given its messages' topics (raises TideError when
# the answer does not fit).
Unpack = Callable[[list[str], gateway_pb2.ProduceResponse, str], list[SendResult]]


class _Entry(Entry):
    """An accumulated message and how its sender waits: a Future for ``send_async``;
    for a blocking ``send()`` one held lock released once its outcome is in (a Future's
    condition, waiter lock and callbacks cost 16 waiting threads more GIL time than the
    rest of the send: docs/performance.md).

    The blocking sends of one answer are woken in a chain: the answer's thread wakes the
    first, and each woken sender wakes the next before anything else. Woken all at once,
    16 threads contended for the GIL and each went back to sleep on it (~3.6 context
    switches a send against ~1.9 chained, and a third less CPU a send:
    docs/performance.md). A sender interrupted while it waits (KeyboardInterrupt) marks
    itself ``left``: whoever then holds its turn passes it on (``_wake``)."""

    __slots__ = ("done", "future", "left", "next", "outcome", "running")

    def __init__(self, topic: str, produce: gateway_pb2.ProduceMessage, *, blocking: bool) -> None:
        super().__init__(topic, produce)
        self.future: Future[SendResult] | None = None if blocking else Future()
        self.done: _thread.LockType | None = None
        if blocking:
            self.done = _thread.allocate_lock()
            self.done.acquire()  # released once, by the answer
        self.outcome: SendResult | BaseException | None = None
        self.running = blocking  # its future marked running (a split send goes again)
        self.next: _Entry | None = None  # the blocking send it wakes once woken
        self.left = False  # its sender stopped waiting (interrupted)

    def start(self) -> bool:
        """Mark the future running; False when it was cancelled (not sent, then)."""
        if not self.running:
            assert self.future is not None  # a blocking send() is never cancelled
            self.running = self.future.set_running_or_notify_cancel()
        return self.running

    def wait(self) -> SendResult:
        """A blocking send's outcome, once answered (its result, or its error raised)."""
        assert self.done is not None
        try:
            self.done.acquire()
        except BaseException:  # interrupted: its turn in the chain must still pass on
            self.left = True
            if self.done.acquire(blocking=False):  # the turn came meanwhile: pass it on
                _wake(self.next)
            raise
        _wake(self.next)
        outcome = self.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome


def _blocking(entries: list[_Entry]) -> int:
    """How many of ``entries`` are blocking send()s."""
    return sum(1 for e in entries if e.done is not None)


def _wake(entry: _Entry | None) -> None:
    """Wake ``entry``'s sender; when it left, take its turn and wake the next instead.
    (A leaving sender sets ``left`` before it tries its lock, this reads ``left`` after
    releasing the lock: whichever then takes the lock passes the turn on, exactly once.)"""
    while entry is not None:
        assert entry.done is not None
        entry.done.release()
        if not entry.left or not entry.done.acquire(blocking=False):
            return
        entry = entry.next


class _SyncSend:
    """A blocking send() under way, from its start until it returns (one per accumulator:
    it holds no state of its own)."""

    __slots__ = ("_accumulator",)

    def __init__(self, accumulator: Accumulator) -> None:
        self._accumulator = accumulator

    def __enter__(self) -> None:
        self._accumulator._sync_sends.append(None)

    def __exit__(self, *exc_info: object) -> None:
        self._accumulator._sync_sends.pop()
        self._accumulator._sync_send_ended()


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
        # the condition's lock, taken directly where nothing waits (Condition's own
        # __enter__ and __exit__ are two more Python calls on every send)
        self._mutex = threading.RLock()
        self._changed = threading.Condition(self._mutex)
        self._batches: Batches[_Entry] = Batches(limits)
        self._calls = 0
        self._closing = False
        self._sender: threading.Thread | None = None
        # When the sender's wait ends (0: it is not waiting): a new batch whose linger
        # ends later needs no wake-up. Sends from many threads used to wake the sender
        # once per message, each time to find nothing to do yet.
        self._wake_s = 0.0
        # send() calls under way (from their start until they return); how many of them
        # wait in an open batch is self._batches.sync_open: when all do, no send() is on
        # its way to join them
        # send() calls under way, one item each (append and pop are atomic: the 16
        # callers woken by one answer do not all take the condition again to leave)
        self._sync_sends: collections.deque[None] = collections.deque()
        self._sync_send = _SyncSend(self)
        # send() calls not on their way to a batch: their messages in calls not answered
        # yet, or waiting for in-flight room. While there are none, a batch opened by a
        # send() needs no wake-up to time its linger: every other send() under way joins
        # it soon, and the last to join wakes the sender (one wake-up a call, not two)
        self._sync_sent = 0
        self._sync_blocked = 0
        self.calls_sent = 0  # Produce calls made (tests, diagnostics)
        self.sender_wakeups = 0  # the sender's waits that ended (tests, diagnostics)
        self.messages_sent = 0

    def sync_send(self) -> _SyncSend:
        """Around a blocking send() (its message built and added inside, then awaited):
        while every send() under way waits in an open batch, those batches go without
        waiting out their linger (no send() is on its way to join them)."""
        return self._sync_send

    def _sync_send_ended(self) -> None:
        """(a send() popped from ``_sync_sends``) wake the sender when every send() still
        under way waits in an open batch: read unlocked as a hint, checked again under
        the condition. No wake-up is lost: a send() that joins a batch checks under the
        condition after any earlier pop."""
        sync_open = self._batches.sync_open
        if sync_open and sync_open == len(self._sync_sends):
            with self._changed:
                sync_open = self._batches.sync_open
                if sync_open and sync_open == len(self._sync_sends):
                    self._changed.notify()

    def add(
        self, topic: str, produce: gateway_pb2.ProduceMessage, *, synced: bool = False
    ) -> Future[SendResult]:
        """Queue one checked message to ``topic`` for a future (``synced``: its sender
        waits for it inside ``sync_send``); waits while the in-flight bound is reached
        (ResourceExhausted after the RPC timeout)."""
        entry = _Entry(topic, produce, blocking=False)
        future = entry.future
        assert future is not None
        size = entry.size_bytes
        on_wait = self._sync_waits_for_room if synced else None
        self._in_flight.acquire(size, self._timeout_s, "send", on_wait=on_wait)
        future.add_done_callback(lambda _: self._in_flight.release(size))
        self._add_or_settle(entry, synced)
        return future

    def send(self, topic: str, produce: gateway_pb2.ProduceMessage) -> SendResult:
        """Queue one checked message to ``topic`` of a blocking send() (inside
        ``sync_send``) and wait for its outcome: its result, or its error raised."""
        entry = _Entry(topic, produce, blocking=True)
        self._in_flight.acquire(
            entry.size_bytes, self._timeout_s, "send", on_wait=self._sync_waits_for_room
        )
        self._add_or_settle(entry, True)
        return entry.wait()

    def _sync_waits_for_room(self, waiting: int) -> None:
        """(from the in-flight bound, under its lock) a send() starts (1) or stops (-1)
        waiting for room: while it waits, open batches' lingers are timed again."""
        with self._mutex:
            self._sync_blocked += waiting
            if waiting > 0:
                self._changed.notify()

    def _add_or_settle(self, entry: _Entry, synced: bool) -> None:
        try:
            self._add(entry, synced)
        except BaseException as exc:
            self._settle([entry], exc)  # releases the in-flight room
            raise

    def _add(self, entry: _Entry, synced: bool) -> None:
        with self._mutex:
            if self._closing:
                raise TideError("the producer is closed")
            done = self._batches.add(entry, synced=synced)
            # only what changes the sender's next step wakes it: a batch ready, a new
            # linger ending before its wait does, or every send() now waiting in a batch
            wake = done == READY
            if done == OPENED and not (synced and self._sync_sent == self._sync_blocked == 0):
                wake = time.monotonic() + self._limits.linger_s < self._wake_s
            if synced and self._batches.sync_open == len(self._sync_sends):
                wake = True
            self._start_sender()
            if wake:
                self._changed.notify()

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
            self._changed.notify()  # the sender is the only one waiting
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

    def _next_batch(self) -> Batch[_Entry] | None:
        """The next batch to send once a call is free; None when closed and all done."""
        with self._changed:
            while True:
                if self._closing and self._batches.idle and self._calls == 0:
                    return None
                wait_s = IDLE_WAIT_S
                now_s = time.monotonic()
                free = self._calls < self._limits.max_calls
                if free:
                    batch, wait_s = self._batches.due(
                        now_s, closing=self._closing, sync_sends=len(self._sync_sends)
                    )
                    if batch is not None:
                        self._calls += 1
                        self._sync_sent += _blocking(batch.entries)
                        return batch
                # waiting for a free call, a new batch's linger does not matter (an answer
                # wakes it)
                self._wake_s = now_s + wait_s if free else 0.0
                self._changed.wait(wait_s)
                self._wake_s = 0.0  # awake: a sender will look at every batch anyway
                self.sender_wakeups += 1

    def _send(self, batch: Batch[_Entry]) -> None:
        entries = [e for e in batch.entries if e.running or e.start()]
        sent = _blocking(entries)  # a blocking send() is never cancelled: all of them
        if not entries:
            self._call_done(sent=sent)
            return
        what = batch.what
        request = request_of(entries)
        self.calls_sent += 1
        self.messages_sent += len(entries)
        try:
            answer = self._carry(request, what)
        except BaseException as exc:  # closed under it: each send gets the reason
            self._call_done(sent=sent)
            self._settle(entries, exc)
            return
        answer.add_done_callback(lambda done: self._answered(batch, entries, sent, done, what))

    # -- answers (on the carrier's thread) ----------------------------------------------

    def _answered(
        self,
        batch: Batch[_Entry],
        entries: list[_Entry],
        sent: int,
        done: Future[gateway_pb2.ProduceResponse],
        what: str,
    ) -> None:
        error = done.exception()
        if should_split(batch, entries, error):
            with self._changed:  # before the call is freed: they go next
                self._batches.split(batch.topic, entries)
            self._call_done(sent=sent, wake=True)  # they are ready
            return
        self._call_done(sent=sent)
        if error is not None:
            self._settle(entries, error)
            return
        try:
            # a batch is of one topic
            results = self._unpack([batch.topic] * len(entries), done.result(), what)
        except TideError as exc:
            self._settle(entries, exc)
            return
        self._settle(entries, outcomes(results))

    def _settle(
        self, entries: list[_Entry], outcome: BaseException | list[SendResult | TideError]
    ) -> None:
        """Give each entry its outcome (one for all, or one each): futures are set (their
        callbacks free their in-flight room); blocking sends get theirs, are chained and
        the first is woken (each wakes the next), and their room is freed in one step for
        the lot."""
        freed_sends = freed_bytes = 0
        first: _Entry | None = None
        last: _Entry | None = None
        for i, entry in enumerate(entries):
            own = outcome if isinstance(outcome, BaseException) else outcome[i]
            future = entry.future
            if future is not None:
                if isinstance(own, BaseException):
                    future.set_exception(own)
                else:
                    future.set_result(own)
                continue
            assert entry.done is not None
            freed_sends += 1
            freed_bytes += entry.size_bytes
            entry.outcome = own
            if last is None:
                first = entry
            else:
                last.next = entry
            last = entry
        _wake(first)  # every outcome is in before the first is woken
        if freed_sends:
            self._in_flight.release(freed_bytes, freed_sends)

    def _call_done(self, *, sent: int, wake: bool = False) -> None:
        """A call of ``sent`` blocking sends answered (or not made): their senders are on
        their way. The sender is woken (``wake``: batches were made ready) only when it
        can be waiting for this: all calls were taken, or it is closing. Else it would
        wake to find nothing new: every answer used to wake it (2.8 wake-ups a call with
        16 blocking senders)."""
        with self._mutex:
            self._calls -= 1
            self._sync_sent -= sent
            if wake or self._closing or self._calls == self._limits.max_calls - 1:
                self._changed.notify()  # the sender is the only one waiting

    def _fail_all(self, error: BaseException) -> None:
        with self._changed:
            batches = self._batches.drain()
            self._closing = True
        for batch in batches:
            self._settle([e for e in batch.entries if e.start()], error)

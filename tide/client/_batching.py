"""The accumulator's batching rules, shared by the thread-based producer
(``_accumulator.py``) and the asyncio one (``aio/_accumulator.py``): which open batch a
message joins, when a batch is due, how a refused call is split, and what each message
of an answered call gets. Pure bookkeeping, no threads, no locks: the caller serializes
(the sync accumulator under its condition, the asyncio one on its event loop).

Rules (docs/client.md, "Batching and linger"): single sends are grouped per topic; a
batch goes when it holds ``batch_max_messages`` or ``batch_max_bytes`` (a message that
does not fit starts the next batch, one larger than that goes alone) or ``linger_ms``
after its first message (at once when closing). A call refused because of one message
(the gateway checks every message before writing any, and names it: ``messages[i]``)
is sent again message by message, so each gets the answer it would have had alone.
"""

from __future__ import annotations

import collections
import re
import time
from typing import Generic, TypeVar

import grpc

from tide.client._errors import InvalidArgument, TideError
from tide.client._rpc import MAX_SEND_BYTES
from tide.client._types import SendResult, SendStatus
from tide.v1 import gateway_pb2

# The sender wakes at least this often (a bound on its waits; it is woken sooner).
IDLE_WAIT_S = 1.0
# A refusal that names one message of the request: the gateway wrote none of them.
_NAMES_MESSAGE = re.compile(r"\bmessages\[\d+\]")
_REFUSALS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND})
# ProduceRequest.messages is field 1: a one-byte key and the length (up to 5 bytes).
_FIELD_OVERHEAD_BYTES = 6


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


class Entry:
    """One accumulated message: its topic and its checked ProduceMessage (the
    accumulators add the future of their kind)."""

    __slots__ = ("produce", "size_bytes", "topic")

    def __init__(self, topic: str, produce: gateway_pb2.ProduceMessage) -> None:
        self.topic = topic
        self.produce = produce
        self.size_bytes = entry_bytes(produce)


E = TypeVar("E", bound=Entry)


def entry_bytes(produce: gateway_pb2.ProduceMessage) -> int:
    """A message's share of a request; InvalidArgument past what the gateway takes
    (what send_batch refuses too)."""
    size = produce.ByteSize() + _FIELD_OVERHEAD_BYTES
    if size > MAX_SEND_BYTES:
        raise InvalidArgument(
            f"a message of {size} bytes; the gateway takes requests up to "
            f"{MAX_SEND_BYTES} bytes: send a smaller message"
        )
    return size


class Batch(Generic[E]):
    __slots__ = ("entries", "size_bytes", "splittable", "started_s", "synced", "topic")

    def __init__(self, topic: str, *, splittable: bool = True) -> None:
        self.topic = topic
        self.entries: list[E] = []
        self.size_bytes = 0
        self.synced = 0  # its entries whose sender waits in a blocking send()
        self.started_s = time.monotonic()
        self.splittable = splittable

    @property
    def what(self) -> str:
        return f"Produce to {self.topic!r}"


# What Batches.add did: the sender's next step changes only when a batch was opened
# (a new linger to time) or made ready.
JOINED = 0
OPENED = 1
READY = 2


def request_of(entries: list[E]) -> gateway_pb2.ProduceRequest:
    request = gateway_pb2.ProduceRequest(compact_results=True)
    # extend copies each message as the constructor does, ~25 % cheaper (upb)
    request.messages.extend([e.produce for e in entries])
    return request


class Batches(Generic[E]):
    """The open batch of each topic and the batches ready to go, in order."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._open: dict[str, Batch[E]] = {}
        self._ready: collections.deque[Batch[E]] = collections.deque()
        # Messages in open batches whose sender waits in a blocking send() (the sync
        # accumulator's sync-send rule; the asyncio one adds none)
        self.sync_open = 0

    @property
    def idle(self) -> bool:
        return not self._open and not self._ready

    def add(self, entry: E, *, synced: bool = False) -> int:
        """Add a message (``synced``: its sender waits for it in a blocking send());
        READY when that made a batch ready, OPENED when it opened one (a new linger),
        JOINED when it only joined an open batch."""
        limits = self.limits
        done = JOINED
        topic = entry.topic
        batch = self._open.get(topic)
        if batch is not None and batch.size_bytes + entry.size_bytes > limits.batch_max_bytes:
            self._make_ready(topic)  # this one starts the next
            batch, done = None, READY
        if batch is None:
            batch = self._open[topic] = Batch(topic)
            done = max(done, OPENED)
        batch.entries.append(entry)
        batch.size_bytes += entry.size_bytes
        if synced:
            batch.synced += 1
            self.sync_open += 1
        full = batch.size_bytes >= limits.batch_max_bytes  # a larger message goes alone
        if full or len(batch.entries) >= limits.batch_max_messages:
            self._make_ready(topic)
            done = READY
        return done

    def _make_ready(self, topic: str) -> Batch[E]:
        """Close ``topic``'s open batch: it goes next."""
        batch = self._open.pop(topic)
        self.sync_open -= batch.synced
        self._ready.append(batch)
        return batch

    def due(
        self, now_s: float, *, closing: bool, sync_sends: int = 0
    ) -> tuple[Batch[E] | None, float]:
        """A full batch, else the oldest open one past its linger (all when closing);
        else how long until the first linger ends. When every one of the ``sync_sends``
        blocking send()s under way waits in an open batch, those batches go at once: no
        send() is on its way to join them, lingering would only hold their callers."""
        if self.sync_open and self.sync_open == sync_sends:
            for batch in [b for b in self._open.values() if b.synced]:
                self._make_ready(batch.topic)
        if self._ready:
            return self._ready.popleft(), 0.0
        if not self._open:
            return None, IDLE_WAIT_S
        oldest = min(self._open.values(), key=lambda b: b.started_s)
        left_s = oldest.started_s + self.limits.linger_s - now_s
        if left_s <= 0 or closing:
            self._make_ready(oldest.topic)
            return self._ready.popleft(), 0.0
        return None, min(left_s, IDLE_WAIT_S)

    def split(self, topic: str, entries: list[E]) -> None:
        """Queue each message of a refused call alone, first in line."""
        for entry in reversed(entries):
            single: Batch[E] = Batch(topic, splittable=False)
            single.entries.append(entry)
            single.size_bytes = entry.size_bytes
            self._ready.appendleft(single)

    def drain(self) -> list[Batch[E]]:
        """Every batch not sent yet (the accumulator fails them)."""
        batches = list(self._ready) + list(self._open.values())
        self._ready.clear()
        self._open.clear()
        self.sync_open = 0
        return batches


def should_split(batch: Batch[E], entries: list[E], error: BaseException | None) -> bool:
    """Whether a failed call is sent again message by message."""
    return error is not None and batch.splittable and len(entries) > 1 and names_one(error)


def outcomes(results: list[SendResult]) -> list[SendResult | TideError]:
    """Each message's outcome by send's rule: a message not written is an error of its
    own."""
    failed = SendStatus.SEND_FAILED  # ``written``, without a property call a message
    return [
        result
        if result.status is not failed
        else TideError(f"send to {result.queue.topic!r} failed: {result.error}")
        for result in results
    ]


def names_one(error: BaseException) -> bool:
    """A refusal about one message of the call (nothing of it was written)."""
    return (
        isinstance(error, TideError)
        and error.code in _REFUSALS
        and _NAMES_MESSAGE.search(error.message) is not None
    )

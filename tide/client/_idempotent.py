"""``IdempotentProducer``: sends that a retry never stores twice (Kafka's idempotent
producer, NATS JetStream's ``Nats-Msg-Id`` window; docs/client.md "Exactly-once produce").

The producer has an id (``producer_id``: one of the caller's, stable across restarts, or
a random one) and numbers its messages per queue: batch n of a queue carries sequences
``first..first + count - 1`` and the broker's storage keeps, per producer and queue, the
last batches it stored with their results. A retry of a batch the storage kept (the
answer was lost, the gateway failed over, the client restarted and sends it again with
the same id and sequences) is answered with the original result and written nothing.

Sequences are per queue, so the producer picks the queue itself: the message's
``queue``; for a message group (``sharding_key``) the queue its key hashes to over the
topic's writable queues, as the gateway hashes a sharding key (RocketMQ's
SelectMessageQueueByHash: a group keeps its queue while the route does not change), the
group going with the message as ``__SHARDINGKEY`` (a FIFO topic's message group); else
the topic's writable queues from its route in turn, one queue per batch.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType

from tide.auth.client import Credentials
from tide.client._errors import InvalidArgument, TideError
from tide.client._producer import MAX_BATCH_MESSAGES, _request, _results
from tide.client._pull_consumer import GatewayReader, writable_queues
from tide.client._rpc import (
    DEFAULT_GATEWAY,
    DEFAULT_RPC_TIMEOUT_MS,
    ClientTls,
    Connection,
    RetryPolicy,
)
from tide.client._types import Message, MessageQueue, SendResult
from tide.format import SHARDING_KEY, producer_id_error, sharding_key_index

FIFO = "FIFO"  # TopicRoute.message_type of a FIFO topic

# Idempotent retries are safe, so a producer retries longer than a plain one by default.
DEFAULT_IDEMPOTENT_RETRY = RetryPolicy(max_attempts=8, max_backoff_ms=5_000)


@dataclasses.dataclass(frozen=True)
class IdempotentSend:
    """What a batch was: its queue, first sequence, results; ``duplicate`` when the broker
    answered a retry with the results it stored before."""

    queue: MessageQueue
    first_sequence: int
    results: list[SendResult]
    duplicate: bool


def _to_queue(message: Message, queue: MessageQueue, fifo: bool) -> Message:
    """The message as sent: to ``queue``; on a FIFO topic with its group (if any) as
    ``__SHARDINGKEY``, as the gateway stores a sharding key there (an idempotent batch
    names its queue, so the group travels as the property the topic checks and
    consumers see). Elsewhere a sharding key is only a route, as for a plain producer."""
    if message.sharding_key is None or not fifo:
        return dataclasses.replace(message, queue=queue, sharding_key=None)
    properties = {**message.properties, SHARDING_KEY: message.sharding_key}
    return dataclasses.replace(message, queue=queue, sharding_key=None, properties=properties)


class IdempotentProducer:
    """Sends batches exactly once per (producer id, queue, sequence). Thread-safe: the
    sequences of a queue are taken in order under a lock, one batch of a queue at a
    time (a later batch must not reach the broker first: that is a gap).

    ``epoch``: a producer id used again for new work (a stream's next micro-batch) takes
    a higher epoch: every queue's sequences start again at 0, and the broker refuses the
    batches of older epochs (FailedPrecondition), as Kafka fences a zombie producer.

    ``next_sequences`` continues a producer id after a restart: the next sequence per
    queue (what :meth:`next_sequence` said before the restart), default 0. Resending a
    batch with the sequences it had before is answered with its original results as long
    as the broker keeps it (the last ``producer_window_batches`` batches of the queue, for
    ``producer_id_expiry_ms`` after the producer's last send)."""

    def __init__(
        self,
        gateway: str = DEFAULT_GATEWAY,
        *,
        producer_id: str | None = None,
        epoch: int = 0,
        next_sequences: Mapping[MessageQueue, int] | None = None,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        tls: ClientTls = False,
        credentials: Credentials | None = None,
    ) -> None:
        self.producer_id = producer_id if producer_id is not None else uuid.uuid4().hex
        error = producer_id_error(self.producer_id)
        if error is not None:
            raise InvalidArgument(f"producer_id {self.producer_id[:80]!r}: {error}")
        if epoch < 0:
            raise InvalidArgument(f"epoch is {epoch}; give 0 or more")
        self.epoch = epoch
        self._next: dict[MessageQueue, int] = dict(next_sequences or {})
        if any(seq < 0 for seq in self._next.values()):
            raise InvalidArgument("next_sequences must be 0 or more")
        self._connection = Connection(
            gateway,
            rpc_timeout_ms=rpc_timeout_ms,
            retry=retry or DEFAULT_IDEMPOTENT_RETRY,
            tls=tls,
            credentials=credentials,
        )
        self._lock = threading.Lock()
        self._queues: dict[str, list[MessageQueue]] = {}
        self._fifo: dict[str, bool] = {}  # from the route, with the queues
        self._turn: dict[str, int] = {}

    def next_sequence(self, queue: MessageQueue) -> int:
        with self._lock:
            return self._next.get(queue, 0)

    def send(
        self,
        topic: str,
        body: bytes | str,
        *,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        queue: MessageQueue | None = None,
        sharding_key: str | None = None,
    ) -> SendResult:
        """One message, as a batch of one (``sharding_key``: its message group)."""
        message = Message(
            topic,
            body,
            tags=tags,
            keys=keys,
            properties=properties or {},
            queue=queue,
            sharding_key=sharding_key,
        )
        (result,) = self.send_batch([message]).results
        return result

    def send_batch(
        self, messages: Sequence[Message], *, first_sequence: int | None = None
    ) -> IdempotentSend:
        """One batch to one queue: every message's ``queue``, or the queue of every
        message's group (``sharding_key``: :meth:`queue_for`; groups of one batch must
        share a queue), or none of them: the topic's next. ``first_sequence`` resends a
        batch sent before (after a restart) with the sequences it had; default: the
        queue's next. Raises TideError: OutOfRange for a sequence the broker does not take
        (naming the one it expects), AlreadyExists for a batch stored before but older
        than the broker's window."""
        if not messages or len(messages) > MAX_BATCH_MESSAGES:
            raise InvalidArgument(f"give 1..{MAX_BATCH_MESSAGES} messages, not {len(messages)}")
        queue = self._queue_of(messages)
        fifo = self._fifo.get(queue.topic, False)  # known when a group chose the queue
        batch = [_to_queue(m, queue, fifo) for m in messages]
        request, _, what = _request(batch)
        request.producer_id = self.producer_id
        request.producer_epoch = self.epoch
        with self._lock:  # one batch of this producer at a time: the sequences stay in order
            first = self._next.get(queue, 0) if first_sequence is None else first_sequence
            request.first_sequence = first
            response = self._connection.call(self._connection.stub.Produce, request, what)
            results = _results(batch, response, what)
            self._next[queue] = max(self._next.get(queue, 0), first + len(batch))
        return IdempotentSend(queue, first, results, response.duplicate)

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues (from its route when first asked), sorted."""
        queues = self._queues.get(topic)
        if queues is None:
            route = GatewayReader(self._connection).route(topic)
            queues = writable_queues(route)
            if not queues:
                raise TideError(f"topic {topic!r} has no writable queue")
            self._fifo[topic] = route.message_type == FIFO
            self._queues[topic] = queues
        return queues

    def next_queue(self, topic: str) -> MessageQueue:
        """The topic's next queue in turn (what a batch without a queue goes to)."""
        queues = self.queues(topic)
        with self._lock:
            turn = self._turn.get(topic, 0)
            self._turn[topic] = turn + 1
        return queues[turn % len(queues)]

    def queue_for(self, topic: str, sharding_key: str) -> MessageQueue:
        """The queue of a message group: its key hashed over the topic's writable queues
        sorted by (broker, queue id), as the gateway and RocketMQ hash a sharding key."""
        queues = self.queues(topic)
        return queues[sharding_key_index(sharding_key, len(queues))]

    def skip(self, queue: MessageQueue, count: int) -> None:
        """Count ``count`` sequences of ``queue`` as used (a batch the broker answered
        AlreadyExists for: stored before)."""
        with self._lock:
            self._next[queue] = self._next.get(queue, 0) + count

    def _queue_of(self, messages: Sequence[Message]) -> MessageQueue:
        topic = messages[0].topic
        if any(m.topic != topic for m in messages):
            raise InvalidArgument("an idempotent batch goes to one topic and one queue")
        keys = {m.sharding_key for m in messages}
        if keys != {None}:
            if None in keys or any(m.queue is not None for m in messages):
                raise InvalidArgument(
                    "give every message of an idempotent batch a sharding_key (its "
                    "message group) and none a queue, or none a sharding_key"
                )
            found = {key: self.queue_for(topic, key) for key in keys if key is not None}
            if len(set(found.values())) != 1:
                where = ", ".join(f"{key!r:.40} -> {queue}" for key, queue in found.items())
                raise InvalidArgument(
                    "an idempotent batch goes to one queue, and these message groups "
                    f"hash to several ({where[:300]}): split the batch by queue_for()"
                )
            return next(iter(found.values()))
        given = {m.queue for m in messages}
        if len(given) != 1:
            raise InvalidArgument("an idempotent batch goes to one topic and one queue")
        (queue,) = given
        return queue if queue is not None else self.next_queue(topic)

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> IdempotentProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

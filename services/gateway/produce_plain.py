"""The common produce request: one topic, no explicit queue, no sharding key.

Its messages all take the topic's next round robin queue (a batch, as RocketMQ's batch
send) and are encoded into one record run; the outcome is kept per message index. When
the queue's broker could not be reached (or had no master) they are listed in
:attr:`PlainBatch.unsent` for the general path's retries (produce.py).

A batch whose messages all have a sharding key hashing to one queue (one message group,
or groups sharing a queue: FIFO produce) takes the same path to that queue
(``queue``); on a FIFO topic each record carries its group as ``__SHARDINGKEY``. A batch
whose keys hash to several queues of the topic (``parts``: a FIFO producer batching
many groups) is split by queue, each queue's messages in their order (so each group's
order is kept), and each broker's queues go in one run, one part after the other
(produce.py ``_send_spread``): the general path's one Append per broker, the
answer per message in the request's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, repeat

from services.gateway.produce_results import Appended, Written
from services.gateway.records import add_message
from services.gateway.routes import Member, QueueRef, TopicView
from tide.format import (
    SHARDING_KEY,
    UNIQ_KEY,
    RunWriter,
    TopicMessageType,
    encode_bodies_run,
    scan_bodies,
)
from tide.format._core import using_extensions
from tide.naming import topic_error
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb


def bodies_wire(
    request: pb.ProduceRequest, max_body_bytes: int, wire: bytes | None = None
) -> tuple[str, bytes] | None:
    """(topic, ``wire``: the request serialized, made here when not given) when the
    compiled core runs and the request is bodies only of one valid topic
    (tide.format.scan_bodies: one C pass over its bytes instead of a look at each
    message); else None: validate.py checks it field by field (and names what is
    wrong). The pure-Python path keeps that check, cheaper than reading the bytes in
    Python."""
    if not using_extensions():
        return None
    if wire is None:
        wire = request.SerializeToString()
    found = scan_bodies(wire, max_body_bytes)
    if found is None:
        return None
    try:
        topic = found[0].decode("utf-8")  # protobuf checked the string's encoding
    except UnicodeDecodeError:
        return None
    if topic_error(topic) is not None:
        return None
    return topic, wire


@dataclass(slots=True)
class PlainGroup:
    """Where the batch goes (its queue's broker master and queue id), and its run."""

    member: Member
    writer: RunWriter
    queue_id: int


class PlainBatch:
    def __init__(
        self,
        messages: Sequence[pb.ProduceMessage],
        unique_keys: list[str],
        view: TopicView,
        *,
        bodies_only: bool,
        compact: bool = False,
        queue: QueueRef | None = None,
        parts: list[tuple[QueueRef, list[int]]] | None = None,
    ) -> None:
        """``bodies_only``: no message has more than a topic and a body (validate.py), or
        than a topic, a body and its sharding key (with ``queue``);
        ``compact``: the request asked for compact results, so a batch written by one
        append keeps that append's answer (:attr:`appended`) instead of rows;
        ``queue``: every message has a sharding key hashing to this queue (else the
        topic's next round robin queue is taken); ``parts``: every message has a
        sharding key, and these are the queues they hash to, with the positions of each
        one's messages (selection.sharding_parts)."""
        self.messages = messages
        self.bodies_only = bodies_only
        self.queue = queue
        self.parts = parts
        # Routed by their sharding keys: hashed again over the other brokers' queues
        # when retried (a normal topic's) or never moved (a FIFO topic's).
        self.sharded = queue is not None or parts is not None
        # A FIFO topic's messages keep their group (the general path's rule).
        self.groups = self.sharded and view.message_type is TopicMessageType.FIFO
        self.compact = compact
        self.appended: Appended | None = None
        self.unique_keys = unique_keys
        # The request serialized, when its messages are bodies only (validate.py) as
        # tide.format.scan_bodies told: encoded from these bytes in one compiled pass.
        self.wire: bytes | None = None
        self.view = view
        count = len(messages)
        self.rows: list[Written | None] = [None] * count
        self.errors: list[ServiceError | None] = [None] * count
        # (index, broker name) of messages not written because their broker could not be
        # reached (or had no master): sent again elsewhere when retries are allowed.
        self.unsent: list[tuple[int, str]] = []

    def encode(
        self,
        group: PlainGroup,
        magic: int,
        topic_part: bytes,
        now_ms: int,
        positions: Sequence[int] | None = None,
    ) -> None:
        """The batch's messages (those at ``positions``, in that order, when given) into
        the group's run (born now unless a message says when)."""
        messages, keys, queue_id = self.messages, self.unique_keys, group.queue_id
        if positions is not None:
            messages = [messages[index] for index in positions]
            keys = [keys[index] for index in positions]
        elif self.wire is not None and not self.groups:
            encode_bodies_run(
                group.writer, self.wire, magic, topic_part, queue_id, keys, UNIQ_KEY, now_ms
            )
            return
        if self.bodies_only:  # one loop over whole columns
            bodies = [m.body for m in messages]
            if self.groups:  # message_properties' order: UNIQ_KEY, then the group
                properties = [
                    f"{UNIQ_KEY}\x01{key}\x02{SHARDING_KEY}\x01{m.sharding_key}\x02".encode()
                    for m, key in zip(messages, keys, strict=True)
                ]
            else:
                properties = [f"{UNIQ_KEY}\x01{key}\x02".encode() for key in keys]
            queue_ids = [queue_id] * len(messages)
            group.writer.add_many(magic, topic_part, queue_ids, bodies, properties, now_ms)
            return
        if self.groups:
            for message, key in zip(messages, keys, strict=True):
                add_message(group.writer, message, queue_id, key, now_ms, message.sharding_key)
            return
        for message, key in zip(messages, keys, strict=True):
            add_message(group.writer, message, queue_id, key, now_ms)

    def failed(self, indexes: Sequence[int], error: ServiceError, unsent: str | None) -> None:
        """The messages at ``indexes`` were not written, for ``error``; ``unsent``: the
        broker that could not be reached (or had no master), so they may go elsewhere."""
        errors = self.errors
        for index in indexes:
            errors[index] = error
        if unsent is not None:
            self.unsent.extend((index, unsent) for index in indexes)

    def written(self, positions: Sequence[int] | None, rows: list[Written]) -> None:
        """The rows of the messages at ``positions`` (None: of the whole batch)."""
        if positions is None:
            self.rows[:] = rows
            return
        all_rows = self.rows
        for index, row in zip(positions, rows, strict=True):
            all_rows[index] = row


@dataclass(slots=True)
class BrokerRun:
    """A split batch's messages for one broker: their positions (queue by queue), their
    queue ids, and their run (None: the broker has no master in the route)."""

    broker_name: str
    positions: list[int]
    queue_ids: list[int]
    group: PlainGroup | None


def broker_runs(
    plain: PlainBatch,
    parts: list[tuple[QueueRef, list[int]]],
    born_host: bytes,
    magic: int,
    topic_part: bytes,
    now_ms: int,
) -> list[BrokerRun]:
    """A batch split by queue (selection.sharding_parts) as one run per broker, its
    queues one after the other, each queue's messages in their order (a loop over
    queues: the messages are copied by C-level list operations and encoded in columns)."""
    brokers: dict[str, list[tuple[int, list[int]]]] = {}
    for queue, found in parts:
        brokers.setdefault(queue.broker_name, []).append((queue.queue_id, found))
    runs = []
    for name, queues in brokers.items():
        positions = list(chain.from_iterable(found for _, found in queues))
        queue_ids = list(chain.from_iterable(repeat(q, len(found)) for q, found in queues))
        member = plain.view.master(name)
        group = None
        if member is not None:
            writer = RunWriter(born_host)
            for queue_id, found in queues:
                plain.encode(PlainGroup(member, writer, queue_id), magic, topic_part, now_ms, found)
            group = PlainGroup(member, writer, queue_ids[0])
        runs.append(BrokerRun(name, positions, queue_ids, group))
    return runs

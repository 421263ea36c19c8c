"""The common produce request: one topic, no explicit queue, no sharding key.

Its messages all take the topic's next round robin queue (a batch, as RocketMQ's batch
send) and are encoded into one record run; the outcome is kept per message index. When
the queue's broker could not be reached (or had no master) they are listed in
:attr:`PlainBatch.unsent` for the general path's retries (produce.py).

A batch whose messages all have a sharding key hashing to one queue (one message group,
or groups sharing a queue: FIFO produce) takes the same path to that queue
(``sharded``); on a FIFO topic each record carries its group as ``__SHARDINGKEY``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    ) -> None:
        """``bodies_only``: no message has more than a topic and a body (validate.py), or
        than a topic, a body and its sharding key (with ``queue``);
        ``compact``: the request asked for compact results, so a batch written by one
        append keeps that append's answer (:attr:`appended`) instead of rows;
        ``queue``: every message has a sharding key hashing to this queue (else the
        topic's next round robin queue is taken)."""
        self.messages = messages
        self.bodies_only = bodies_only
        self.queue = queue
        # A FIFO topic's messages keep their group (the general path's rule).
        self.groups = queue is not None and view.message_type is TopicMessageType.FIFO
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

    def encode(self, group: PlainGroup, magic: int, topic_part: bytes, now_ms: int) -> None:
        """The batch's messages into the group's run (born now unless a message says when)."""
        messages, keys, queue_id = self.messages, self.unique_keys, group.queue_id
        if self.wire is not None and not self.groups:
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

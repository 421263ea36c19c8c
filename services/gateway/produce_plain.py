"""The common produce request: one topic, no explicit queue, no sharding key.

Its messages take the topic's next round robin queues in one step and are encoded into
one record run per broker as they are grouped; the outcome is kept per message index.
Messages of a broker that could not be reached are listed in :attr:`PlainBatch.unsent`
for the general path's retries (produce.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.gateway.produce_results import Written
from services.gateway.records import add_message
from services.gateway.routes import Member, TopicView
from tide.format import UNIQ_KEY, RunWriter
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb


@dataclass(slots=True)
class PlainGroup:
    """The messages of one broker: their run, indices and queue ids."""

    member: Member
    writer: RunWriter
    indices: list[int] = field(default_factory=list)
    queue_ids: list[int] = field(default_factory=list)


class PlainBatch:
    def __init__(
        self,
        messages: Sequence[pb.ProduceMessage],
        unique_keys: list[str],
        view: TopicView,
        *,
        bodies_only: bool,
    ) -> None:
        """``bodies_only``: no message has more than a topic and a body (validate.py)."""
        self.messages = messages
        self.bodies_only = bodies_only
        self.unique_keys = unique_keys
        self.view = view
        count = len(messages)
        self.rows: list[Written | None] = [None] * count
        self.errors: list[ServiceError | None] = [None] * count
        # (index, broker name) of messages not written because their broker could not be
        # reached (or had no master): sent again elsewhere when retries are allowed.
        self.unsent: list[tuple[int, str]] = []

    def encode(self, group: PlainGroup, magic: int, topic_part: bytes, now_ms: int) -> None:
        """The group's messages into its run (born now unless a message says when)."""
        messages, keys = self.messages, self.unique_keys
        if self.bodies_only:  # one loop over whole columns
            whole = len(group.indices) == len(messages)
            bodies = (
                [m.body for m in messages] if whole else [messages[i].body for i in group.indices]
            )
            group_keys = keys if whole else [keys[i] for i in group.indices]
            properties = [f"{UNIQ_KEY}\x01{key}\x02".encode() for key in group_keys]
            group.writer.add_many(magic, topic_part, group.queue_ids, bodies, properties, now_ms)
            return
        for index, queue_id in zip(group.indices, group.queue_ids, strict=True):
            add_message(group.writer, messages[index], queue_id, keys[index], now_ms)

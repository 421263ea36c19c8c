"""Mixed into ``Admin``: a topic's queues and offsets, a group's offsets and lag, read as an
operator (the console's messages, trace and pending pages) with the Admin's credentials."""

from __future__ import annotations

from tide.client._convert import check_group
from tide.client._pull_consumer import GatewayReader
from tide.client._rpc import Connection
from tide.client._simple_consumer import GroupLag
from tide.client._types import MessageQueue, QueueOffsets
from tide.v1 import gateway_pb2


class OffsetsAdmin:
    """``_connection`` is the Admin's connection."""

    _connection: Connection

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues from its route, sorted by broker and queue id."""
        return GatewayReader(self._connection).queues(topic)

    def queue_offsets(self, queue: MessageQueue) -> QueueOffsets:
        """The queue's min offset and max offset (the offset of the next message)."""
        return GatewayReader(self._connection).offsets(queue)

    def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset of ``queue`` stored at or after ``timestamp_ms``."""
        return GatewayReader(self._connection).search_offset(queue, timestamp_ms)

    def committed(self, group: str, queue: MessageQueue) -> int:
        """``group``'s committed offset on ``queue``, or -1 when it never committed one."""
        check_group(group)
        return GatewayReader(self._connection).committed(group, queue)

    def group_lag(self, group: str, topic: str) -> GroupLag:
        """``group``'s lag on ``topic`` per queue, for pull and POP groups alike (a queue's
        ``consumer_offset`` is -1 when the group has none there)."""
        response = self._connection.call(
            self._connection.stub.GetGroupLag,
            gateway_pb2.GetGroupLagRequest(consumer_group=group, topic=topic),
            f"GetGroupLag of {group!r} on {topic!r}",
        )
        return GroupLag(response.ready, response.inflight, response.delayed, tuple(response.queues))

"""``Admin``'s consumer-progress calls (RocketMQ's mqadmin consumerProgress and
resetOffsetByTime): a topic's queues and offsets, a group's committed offsets, members
and lag, and committing an offset for a group (the web console's groups page)."""

from __future__ import annotations

from tide.client._convert import check_group, check_topic
from tide.client._errors import InvalidArgument
from tide.client._pull_consumer import GatewayReader
from tide.client._rpc import Connection
from tide.client._simple_consumer import GroupLag
from tide.client._types import MessageQueue, QueueOffsets
from tide.v1 import gateway_pb2, storage_pb2


class OffsetsAdmin:
    """Mixed into :class:`tide.client.Admin`."""

    _connection: Connection

    def _reader(self) -> GatewayReader:
        return GatewayReader(self._connection)

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted by broker and queue id."""
        check_topic(topic)
        return self._reader().queues(topic)

    def offsets(self, queue: MessageQueue) -> QueueOffsets:
        """The queue's min offset and max offset (the next message's)."""
        return self._reader().offsets(queue)

    def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset of ``queue`` stored at or after ``timestamp_ms`` (its max
        offset when none is)."""
        if timestamp_ms < 0:
            raise InvalidArgument(f"timestamp_ms is {timestamp_ms}; give 0 or more")
        return self._reader().search_offset(queue, timestamp_ms)

    def committed(self, group: str, queue: MessageQueue) -> int:
        """``group``'s committed offset of ``queue``; -1 when it never committed one."""
        check_group(group)
        return self._reader().committed(group, queue)

    def commit_offset(self, group: str, queue: MessageQueue, offset: int) -> None:
        """Set ``group``'s offset of ``queue`` (a reset: its members read from there once
        they fetch it again, e.g. after a restart or a rebalance)."""
        check_group(group)
        self._reader().commit(group, queue, offset)

    def group_lag(self, group: str, topic: str) -> GroupLag:
        """``group``'s lag on ``topic``: ready, in flight (POP) and delayed, per queue."""
        check_group(group)
        check_topic(topic)
        response = self._connection.call(
            self._connection.stub.GetGroupLag,
            gateway_pb2.GetGroupLagRequest(consumer_group=group, topic=topic),
            f"GetGroupLag of {group!r} on {topic!r}",
        )
        return GroupLag(response.ready, response.inflight, response.delayed, tuple(response.queues))

    def members(self, group: str) -> list[storage_pb2.ConsumerMember]:
        """The group's live members with their subscriptions, sorted by client id."""
        check_group(group)
        response = self._connection.call(
            self._connection.stub.GetConsumers,
            storage_pb2.GetConsumersRequest(consumer_group=group),
            f"GetConsumers of group {group!r}",
        )
        return sorted(response.members, key=lambda member: member.client_id)

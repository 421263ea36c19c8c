"""``Admin``: topics and the cluster, through a gateway (mqadmin's calls)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import NamedTuple

from tide.client._convert import check_group, check_topic, from_stored_message
from tide.client._errors import InvalidArgument, NotFound
from tide.client._rpc import DEFAULT_GATEWAY, DEFAULT_RPC_TIMEOUT_MS, Connection, RetryPolicy
from tide.client._types import ReceivedMessage
from tide.limits import QUEUE_NUMS_MAX
from tide.v1 import gateway_pb2, nameserver_pb2, storage_pb2

MAX_QUEUE_NUMS = QUEUE_NUMS_MAX  # the servers' limit (tide.limits)
PERM_WRITE = 2
PERM_READ = 4
DEFAULT_QUERY_MAX = 64
MAX_QUERY_MAX = 1000


class Recalled(NamedTuple):
    """A timed message cancelled before it was due (:meth:`Admin.recall`)."""

    unique_key: str
    deliver_at_ms: int


class Admin:
    """Create, delete and list topics; read routes, the cluster and group members.

    Routes and cluster info are returned as the tide.v1 messages (``TopicRoute``,
    ``ClusterInfo``), which are typed.
    """

    def __init__(
        self,
        gateway: str = DEFAULT_GATEWAY,
        *,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._connection = Connection(gateway, rpc_timeout_ms=rpc_timeout_ms, retry=retry)

    def create_topic(
        self,
        topic: str,
        *,
        read_queue_nums: int = 4,
        write_queue_nums: int | None = None,
        perm: int = PERM_READ | PERM_WRITE,
        order: bool = False,
        broker_names: Sequence[str] = (),
        cluster_name: str = "",
    ) -> list[str]:
        """Create (or update) ``topic`` on these brokers, or every master of the cluster,
        or (neither given) every master broker; returns the brokers it is on now."""
        check_topic(topic)
        write = read_queue_nums if write_queue_nums is None else write_queue_nums
        for name, value in (("read_queue_nums", read_queue_nums), ("write_queue_nums", write)):
            if not 1 <= value <= MAX_QUEUE_NUMS:
                raise InvalidArgument(f"{name} is {value}; give 1..{MAX_QUEUE_NUMS}")
        if perm & ~(PERM_READ | PERM_WRITE) or not perm:
            raise InvalidArgument(f"perm is {perm}; give 2 (write), 4 (read) or 6 (both)")
        response = self._connection.call(
            self._connection.stub.CreateTopic,
            gateway_pb2.CreateTopicRequest(
                topic=topic,
                read_queue_nums=read_queue_nums,
                write_queue_nums=write,
                perm=perm,
                order=order,
                broker_names=list(broker_names),
                cluster_name=cluster_name,
            ),
            f"CreateTopic {topic!r}",
        )
        return list(response.broker_names)

    def delete_topic(self, topic: str) -> bool:
        """Delete ``topic`` from every broker; False when no broker had it."""
        check_topic(topic)
        response = self._connection.call(
            self._connection.stub.DeleteTopic,
            storage_pb2.DeleteTopicRequest(topic=topic),
            f"DeleteTopic {topic!r}",
        )
        return response.existed

    def list_topics(self) -> list[str]:
        response = self._connection.call(
            self._connection.stub.ListTopics,
            nameserver_pb2.ListRouteTopicsRequest(),
            "ListTopics",
        )
        return list(response.topics)

    def route(self, topic: str) -> nameserver_pb2.TopicRoute:
        check_topic(topic)
        return self._connection.call(
            self._connection.stub.GetTopicRoute,
            nameserver_pb2.GetTopicRouteRequest(topic=topic),
            f"GetTopicRoute of {topic!r}",
        )

    def cluster(self) -> nameserver_pb2.ClusterInfo:
        return self._connection.call(
            self._connection.stub.GetClusterInfo,
            nameserver_pb2.GetClusterInfoRequest(),
            "GetClusterInfo",
        )

    def consumers(self, group: str) -> list[str]:
        """The client ids of the group's live members, sorted."""
        check_group(group)
        response = self._connection.call(
            self._connection.stub.GetConsumers,
            storage_pb2.GetConsumersRequest(consumer_group=group),
            f"GetConsumers of group {group!r}",
        )
        return sorted(member.client_id for member in response.members)

    def query_id(self, msg_id: str) -> ReceivedMessage:
        """The message with this offset message id (as a send returned it)."""
        if not msg_id:
            raise InvalidArgument("msg_id is empty")
        found = self._query(gateway_pb2.QueryMessageRequest(msg_id=msg_id), f"message {msg_id}")
        if not found:
            raise NotFound(f"QueryMessage: no message with id {msg_id}")
        return found[0]

    def query_key(
        self,
        topic: str,
        key: str,
        *,
        max_count: int = DEFAULT_QUERY_MAX,
        begin_ms: int = 0,
        end_ms: int = 0,
    ) -> list[ReceivedMessage]:
        """Messages of ``topic`` with ``key`` among their keys, newest first; ``begin_ms`` /
        ``end_ms`` bound the store time (both 0: all time)."""
        check_topic(topic)
        if not key or " " in key:
            raise InvalidArgument(f"key {key!r} is empty or contains a space")
        if not 1 <= max_count <= MAX_QUERY_MAX:
            raise InvalidArgument(f"max_count is {max_count}; give 1..{MAX_QUERY_MAX}")
        request = gateway_pb2.QueryMessageRequest(
            key=gateway_pb2.KeyQuery(
                topic=topic, key=key, begin_ms=begin_ms, end_ms=end_ms, max_count=max_count
            )
        )
        return self._query(request, f"key {key!r} of {topic!r}")

    def query_unique_key(self, topic: str, unique_key: str) -> list[ReceivedMessage]:
        """Messages of ``topic`` with this UNIQ_KEY (client message id)."""
        check_topic(topic)
        if not unique_key:
            raise InvalidArgument("unique_key is empty")
        request = gateway_pb2.QueryMessageRequest(
            unique_key=gateway_pb2.UniqueKeyQuery(topic=topic, unique_key=unique_key)
        )
        return self._query(request, f"unique key {unique_key!r} of {topic!r}")

    def recall(self, msg_id: str) -> Recalled:
        """Cancel a timed message before it is due (RocketMQ 5's recall), by the msg_id
        its send returned. FailedPrecondition when it is not a timed message or was
        delivered already, NotFound when no broker has it."""
        if not msg_id:
            raise InvalidArgument("msg_id is empty; give the msg_id the send returned")
        response = self._connection.call(
            self._connection.stub.RecallMessage,
            gateway_pb2.RecallMessageRequest(msg_id=msg_id),
            f"RecallMessage of {msg_id}",
        )
        return Recalled(response.unique_key, response.deliver_at_ms)

    def _query(self, request: gateway_pb2.QueryMessageRequest, what: str) -> list[ReceivedMessage]:
        response = self._connection.call(
            self._connection.stub.QueryMessage, request, f"QueryMessage for {what}"
        )
        return [from_stored_message(m.broker_name, m.message) for m in response.messages]

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

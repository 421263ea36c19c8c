"""``Admin``: topics and the cluster, through a gateway (mqadmin's calls)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from tide.auth.client import Credentials
from tide.client._admin_offsets import OffsetsAdmin
from tide.client._auth_admin import AuthAdmin
from tide.client._closing import Closing
from tide.client._convert import (
    check_group,
    check_topic,
    from_pull_response,
    from_stored_message,
)
from tide.client._errors import InvalidArgument, NotFound
from tide.client._groups import GroupChanges, apply_changes, default_config
from tide.client._rpc import (
    DEFAULT_GATEWAY,
    DEFAULT_RPC_TIMEOUT_MS,
    ClientTls,
    Connection,
    RetryPolicy,
)
from tide.client._transactions import HalfMessage, half_message
from tide.client._types import MessageQueue, PullResult, ReceivedMessage
from tide.limits import PULL_MAX_MESSAGES, QUEUE_NUMS_MAX
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


class Admin(Closing, AuthAdmin, OffsetsAdmin):
    """Create, delete and list topics and group configs; read routes, the cluster and
    group members; a group's offsets and lag (:class:`OffsetsAdmin`).

    Routes and cluster info are returned as the tide.v1 messages (``TopicRoute``,
    ``ClusterInfo``), which are typed.
    """

    def __init__(
        self,
        gateway: str = DEFAULT_GATEWAY,
        *,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        tls: ClientTls = False,
        credentials: Credentials | None = None,
    ) -> None:
        self._connection = Connection(
            gateway,
            rpc_timeout_ms=rpc_timeout_ms,
            retry=retry,
            tls=tls,
            credentials=credentials,
        )

    @classmethod
    def over(cls, connection: Any) -> Admin:
        """An Admin whose calls go through ``connection`` (an object with the
        :class:`Connection`'s ``stub`` and ``call``): the asyncio Admin's bridge to its
        grpc.aio channel, so both share every request and answer conversion."""
        admin = cls.__new__(cls)
        admin._connection = connection
        return admin

    def create_topic(
        self,
        topic: str,
        *,
        read_queue_nums: int = 4,
        write_queue_nums: int | None = None,
        perm: int = PERM_READ | PERM_WRITE,
        order: bool = False,
        message_type: str = "",
        broker_names: Sequence[str] = (),
        cluster_name: str = "",
    ) -> list[str]:
        """Create (or update) ``topic`` on these brokers, or every master of the cluster,
        or (neither given) every master broker; returns the brokers it is on now.
        ``message_type``: NORMAL (empty), FIFO, DELAY, TRANSACTION or MIXED, the messages
        the topic takes (checked by the gateway on produce)."""
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
                message_type=message_type.upper(),
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

    def list_topics(self, *, include_hidden: bool = False) -> list[str]:
        """Every topic, sorted; system, retry and dead-letter topics only with
        ``include_hidden``."""
        return list(self.topic_types(include_hidden=include_hidden))

    def topic_types(self, *, include_hidden: bool = False) -> dict[str, str]:
        """Every topic (sorted, as :meth:`list_topics`) with its message type."""
        response = self._connection.call(
            self._connection.stub.ListTopics,
            nameserver_pb2.ListRouteTopicsRequest(include_hidden=include_hidden),
            "ListTopics",
        )
        types = list(response.message_types)
        if len(types) != len(response.topics):  # a gateway from before message types
            types = ["NORMAL"] * len(response.topics)
        return dict(zip(response.topics, types, strict=True))

    # -- consumer group configs ------------------------------------------------------
    def create_group(
        self,
        group: str,
        *,
        broker_names: Sequence[str] = (),
        cluster_name: str = "",
        **fields: Any,
    ) -> list[str]:
        """Create (or replace) ``group``'s config on these brokers, or every master of
        the cluster, or every master broker; fields not named take the defaults
        (``GroupChanges``: retry_max_times, retry_policy "customized" | "exponential",
        retry_delays_ms, retry_initial_ms / retry_max_ms / retry_multiplier,
        retry_queue_nums, consume_enable, consume_orderly). Returns the brokers."""
        check_group(group)
        config = apply_changes(default_config(group), GroupChanges(**fields))
        return self._upsert_group(config, broker_names, cluster_name)

    def update_group(
        self,
        group: str,
        *,
        broker_names: Sequence[str] = (),
        cluster_name: str = "",
        **fields: Any,
    ) -> list[str]:
        """Change only the named fields of ``group``'s config (its current one, or the
        defaults); see :meth:`create_group`."""
        config = apply_changes(self.get_group(group).group, GroupChanges(**fields))
        return self._upsert_group(config, broker_names, cluster_name)

    def _upsert_group(
        self, config: storage_pb2.GroupConfig, broker_names: Sequence[str], cluster_name: str
    ) -> list[str]:
        response = self._connection.call(
            self._connection.stub.CreateGroup,
            gateway_pb2.CreateGroupRequest(
                group=config, broker_names=list(broker_names), cluster_name=cluster_name
            ),
            f"CreateGroup {config.group_name!r}",
        )
        return list(response.broker_names)

    def get_group(self, group: str) -> storage_pb2.GetGroupResponse:
        """The group's config (``found`` false: it has none, and these are the defaults)."""
        check_group(group)
        return self._connection.call(
            self._connection.stub.GetGroup,
            storage_pb2.GetGroupRequest(group=group),
            f"GetGroup {group!r}",
        )

    def queue_locks(self, group: str, topic: str) -> storage_pb2.GetQueueLocksResponse:
        """The orderly consumers' unexpired queue locks of ``group`` on ``topic``, from
        every master serving it (``in_grace``: a storage grants none yet after its start)."""
        check_group(group)
        check_topic(topic)
        return self._connection.call(
            self._connection.stub.GetQueueLocks,
            storage_pb2.GetQueueLocksRequest(consumer_group=group, topic=topic),
            f"GetQueueLocks of {group!r} on {topic!r}",
        )

    def list_groups(self) -> list[storage_pb2.GroupConfig]:
        """Every group with a config, sorted by name."""
        response = self._connection.call(
            self._connection.stub.ListGroups, storage_pb2.ListGroupsRequest(), "ListGroups"
        )
        return list(response.groups)

    def offset_groups(self, topic: str) -> list[str]:
        """The groups with a committed offset on a queue of ``topic`` on any master
        broker, config or not (a group that only pulls and commits has none), sorted."""
        check_topic(topic)
        response = self._connection.call(
            self._connection.stub.ListGroups,
            storage_pb2.ListGroupsRequest(offsets_topic=topic),
            f"ListGroups with offsets on {topic!r}",
        )
        return list(response.offset_groups)

    def delete_group(self, group: str) -> bool:
        """Forget ``group``'s config on every master broker (it has the defaults again);
        False when no broker had one."""
        check_group(group)
        response = self._connection.call(
            self._connection.stub.DeleteGroup,
            storage_pb2.DeleteGroupRequest(group=group),
            f"DeleteGroup {group!r}",
        )
        return response.existed

    def route(self, topic: str) -> nameserver_pb2.TopicRoute:
        check_topic(topic)
        return self._connection.call(
            self._connection.stub.GetTopicRoute,
            nameserver_pb2.GetTopicRouteRequest(topic=topic),
            f"GetTopicRoute of {topic!r}",
        )

    def cluster(self, with_status: bool = False) -> nameserver_pb2.ClusterInfo:
        """The registered broker members; ``with_status``: also each member's disk usage,
        writability, replication lag and delay level table, asked by the gateway of its
        storage and dispatch (BrokerLiveInfo's status fields)."""
        return self._connection.call(
            self._connection.stub.GetClusterInfo,
            nameserver_pb2.GetClusterInfoRequest(with_status=with_status),
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

    def list_transactions(self, producer_group: str = "", max_count: int = 0) -> list[HalfMessage]:
        """Unresolved half messages of every master broker (of ``producer_group``, or
        all), each broker's oldest first; ``max_count`` per broker (0: 1000)."""
        response = self._connection.call(
            self._connection.stub.ListTransactions,
            gateway_pb2.ListTransactionsRequest(producer_group=producer_group, max_count=max_count),
            "ListTransactions",
        )
        return [half_message(half) for half in response.halves]

    def _query(self, request: gateway_pb2.QueryMessageRequest, what: str) -> list[ReceivedMessage]:
        response = self._connection.call(
            self._connection.stub.QueryMessage, request, f"QueryMessage for {what}"
        )
        return [from_stored_message(m.broker_name, m.message) for m in response.messages]

    def browse_queue(self, queue: MessageQueue, offset: int, max_messages: int = 32) -> PullResult:
        """Up to ``max_messages`` messages of ``queue`` from ``offset`` for an operator
        (BrowseQueue): also a queue consumers may not read (a dead-letter queue is
        write-only); commits nothing and never waits. ``next_offset`` goes on."""
        if offset < 0:
            raise InvalidArgument(f"offset is {offset}; give 0 or more")
        if not 1 <= max_messages <= PULL_MAX_MESSAGES:
            raise InvalidArgument(f"max_messages is {max_messages}; give 1..{PULL_MAX_MESSAGES}")
        request = gateway_pb2.PullRequest(
            topic=queue.topic,
            broker_name=queue.broker_name,
            queue_id=queue.queue_id,
            offset=offset,
            max_messages=max_messages,
            encoding=gateway_pb2.PullRequest.ENCODING_RECORDS,
        )
        response = self._connection.call(
            self._connection.stub.BrowseQueue, request, f"BrowseQueue of {queue} at {offset}"
        )
        return from_pull_response(queue, response)

    def close(self) -> None:
        self._connection.close()

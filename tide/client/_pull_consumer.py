"""``PullConsumer``: the application picks queues and offsets; the group stores offsets."""

from __future__ import annotations

import grpc

from tide.auth.client import Credentials
from tide.client._closing import Closing
from tide.client._convert import check_group, check_topic, from_pull_response
from tide.client._errors import InvalidArgument
from tide.client._rpc import (
    DEFAULT_GATEWAY,
    DEFAULT_RPC_TIMEOUT_MS,
    ClientTls,
    Connection,
    RetryPolicy,
)
from tide.client._types import (
    MessageQueue,
    PullResult,
    QueueOffsets,
    ReceivedMessage,
    SendBackResult,
)
from tide.limits import PULL_MAX_MESSAGES
from tide.v1 import gateway_pb2, nameserver_pb2

MAX_PULL_MESSAGES = PULL_MAX_MESSAGES  # the gateway's limit (tide.limits)
MAX_LONG_POLL_TIMEOUT_MS = 30_000
PERM_WRITE = 2
PERM_READ = 4


def readable_queues(route: nameserver_pb2.TopicRoute) -> list[MessageQueue]:
    """The route's readable queues (read queue count per broker), sorted."""
    queues = [
        MessageQueue(route.topic, data.broker_name, queue_id)
        for data in route.queue_datas
        if data.perm & PERM_READ
        for queue_id in range(data.read_queue_nums)
    ]
    return sorted(set(queues))


def writable_queues(route: nameserver_pb2.TopicRoute) -> list[MessageQueue]:
    """The route's writable queues (write queue count per broker), sorted."""
    queues = [
        MessageQueue(route.topic, data.broker_name, queue_id)
        for data in route.queue_datas
        if data.perm & PERM_WRITE
        for queue_id in range(data.write_queue_nums)
    ]
    return sorted(set(queues))


def pull_request(
    group: str,
    queue: MessageQueue,
    offset: int,
    max_messages: int,
    expression: str,
    long_poll_timeout_ms: int,
    *,
    min_messages: int = 0,
    min_messages_wait_ms: int = 0,
) -> gateway_pb2.PullRequest:
    """A checked Pull request (records encoding)."""
    if not 1 <= max_messages <= MAX_PULL_MESSAGES:
        raise InvalidArgument(f"max_messages is {max_messages}; give 1..{MAX_PULL_MESSAGES}")
    if not 0 <= long_poll_timeout_ms <= MAX_LONG_POLL_TIMEOUT_MS:
        raise InvalidArgument(
            f"long_poll_timeout_ms is {long_poll_timeout_ms}; give 0..{MAX_LONG_POLL_TIMEOUT_MS}"
        )
    check_fill(max_messages, min_messages, min_messages_wait_ms)
    if offset < 0:
        raise InvalidArgument(f"offset is {offset}; give 0 or more")
    return gateway_pb2.PullRequest(
        consumer_group=group,
        topic=queue.topic,
        broker_name=queue.broker_name,
        queue_id=queue.queue_id,
        offset=offset,
        max_messages=max_messages,
        expression=expression,
        long_poll_timeout_ms=long_poll_timeout_ms,
        encoding=gateway_pb2.PullRequest.ENCODING_RECORDS,
        min_messages=min_messages,
        min_messages_wait_ms=min_messages_wait_ms,
    )


def check_fill(max_messages: int, min_messages: int, min_messages_wait_ms: int) -> None:
    """A pull's min_messages (0..max_messages) and its wait (0..30 s), checked."""
    if not 0 <= min_messages <= max_messages:
        raise InvalidArgument(
            f"min_messages is {min_messages}; give 0..max_messages ({max_messages})"
        )
    if not 0 <= min_messages_wait_ms <= MAX_LONG_POLL_TIMEOUT_MS:
        raise InvalidArgument(
            f"min_messages_wait_ms is {min_messages_wait_ms}; give 0..{MAX_LONG_POLL_TIMEOUT_MS}"
        )


def held_ms(request: gateway_pb2.PullRequest) -> int:
    """The longest the gateway may hold ``request`` (its long poll and its min_messages
    wait start together): added to the call's deadline."""
    return max(request.long_poll_timeout_ms, request.min_messages_wait_ms)


def commit_request(
    group: str, queue: MessageQueue, offset: int
) -> gateway_pb2.CommitConsumerOffsetRequest:
    if offset < 0:
        raise InvalidArgument(f"offset is {offset}; give 0 or more")
    return gateway_pb2.CommitConsumerOffsetRequest(
        consumer_group=group,
        topic=queue.topic,
        broker_name=queue.broker_name,
        queue_id=queue.queue_id,
        offset=offset,
    )


def send_back_request(
    group: str, message: ReceivedMessage, delay_level: int, max_reconsume_times: int
) -> gateway_pb2.SendBackRequest:
    if delay_level < -1:
        raise InvalidArgument(
            f"delay_level is {delay_level}; give 0 (the group's retry policy), -1 (the "
            "dead-letter queue) or a delay level"
        )
    if max_reconsume_times < 0:
        raise InvalidArgument(
            f"max_reconsume_times is {max_reconsume_times}; give 0 (the group's) or more"
        )
    return gateway_pb2.SendBackRequest(
        consumer_group=group,
        broker_name=message.queue.broker_name,
        msg_id=message.msg_id,
        delay_level=delay_level,
        max_reconsume_times=max_reconsume_times,
    )


def send_back_what(group: str, message: ReceivedMessage) -> str:
    return f"SendBack of {message.msg_id} ({message.queue}) for group {group!r}"


def send_back_result(answer: gateway_pb2.SendBackResponse) -> SendBackResult:
    return SendBackResult(
        topic=answer.topic,
        dead_lettered=answer.dead_lettered,
        reconsume_times=answer.reconsume_times,
        deliver_at_ms=answer.deliver_at_ms,
        msg_id=answer.msg_id,
    )


def offsets_request(queue: MessageQueue) -> gateway_pb2.QueueOffsetsRequest:
    return gateway_pb2.QueueOffsetsRequest(
        topic=queue.topic, broker_name=queue.broker_name, queue_id=queue.queue_id
    )


def search_request(queue: MessageQueue, timestamp_ms: int) -> gateway_pb2.SearchQueueOffsetRequest:
    return gateway_pb2.SearchQueueOffsetRequest(
        topic=queue.topic,
        broker_name=queue.broker_name,
        queue_id=queue.queue_id,
        timestamp_ms=timestamp_ms,
    )


def committed_request(group: str, queue: MessageQueue) -> gateway_pb2.GetConsumerOffsetRequest:
    return gateway_pb2.GetConsumerOffsetRequest(
        consumer_group=group,
        topic=queue.topic,
        broker_name=queue.broker_name,
        queue_id=queue.queue_id,
    )


class GatewayReader:
    """The gateway calls both consumers share (route, pull, offsets)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def route(self, topic: str) -> nameserver_pb2.TopicRoute:
        check_topic(topic)
        stub = self.connection.stub
        return self.connection.call(
            stub.GetTopicRoute,
            nameserver_pb2.GetTopicRouteRequest(topic=topic),
            f"GetTopicRoute of {topic!r}",
        )

    def queues(self, topic: str) -> list[MessageQueue]:
        return readable_queues(self.route(topic))

    # The module's checked request builder, for the readers' callers (worker, CLI).
    pull_request = staticmethod(pull_request)

    def pull(self, request: gateway_pb2.PullRequest, queue: MessageQueue) -> PullResult:
        """``request`` (made by :func:`pull_request`) for ``queue``'s messages."""
        response = self.connection.call(
            self.connection.stub.Pull,
            request,
            f"Pull from {queue} at {request.offset}",
            extra_timeout_ms=held_ms(request),
        )
        return from_pull_response(queue, response)

    def pull_future(
        self, request: gateway_pb2.PullRequest
    ) -> grpc.Future[gateway_pb2.PullResponse]:
        """Start a pull without waiting: a long poll that ``cancel()`` can end early."""
        return self.connection.future(
            self.connection.stub.Pull,
            request,
            extra_timeout_ms=held_ms(request),
        )

    def offsets(self, queue: MessageQueue) -> QueueOffsets:
        response = self.connection.call(
            self.connection.stub.GetQueueOffsets,
            offsets_request(queue),
            f"GetQueueOffsets of {queue}",
        )
        return QueueOffsets(response.min_offset, response.max_offset)

    def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        response = self.connection.call(
            self.connection.stub.SearchOffset,
            search_request(queue, timestamp_ms),
            f"SearchOffset of {queue} at {timestamp_ms} ms",
        )
        return response.offset

    def try_commit(self, group: str, queue: MessageQueue, offset: int) -> None:
        """:meth:`commit` with one attempt (no retry on UNAVAILABLE): for callers that try
        again later anyway."""
        with self.connection.single_attempt():
            self.commit(group, queue, offset)

    def commit(self, group: str, queue: MessageQueue, offset: int) -> None:
        """Store the group's offset. UNAVAILABLE while the broker's master is down:
        consumer offsets live on the master."""
        self.connection.call(
            self.connection.stub.CommitOffset,
            commit_request(group, queue, offset),
            f"CommitOffset of group {group!r} for {queue}",
        )

    def send_back(
        self,
        group: str,
        message: ReceivedMessage,
        delay_level: int = 0,
        max_reconsume_times: int = 0,
        *,
        single_attempt: bool = False,
    ) -> SendBackResult:
        """SendBack of ``message`` (as pulled) for ``group``; with ``single_attempt`` no
        retry on UNAVAILABLE (for callers that try again later anyway)."""
        request = send_back_request(group, message, delay_level, max_reconsume_times)
        what = send_back_what(group, message)
        if single_attempt:
            with self.connection.single_attempt():
                answer = self.connection.call(self.connection.stub.SendBack, request, what)
        else:
            answer = self.connection.call(self.connection.stub.SendBack, request, what)
        return send_back_result(answer)

    def committed(self, group: str, queue: MessageQueue) -> int:
        response = self.connection.call(
            self.connection.stub.GetOffset,
            committed_request(group, queue),
            f"GetOffset of group {group!r} for {queue}",
        )
        return response.offset


class PullConsumer(Closing):
    """Pulls from queues the application chooses; offsets are stored per group.

    Nothing is tracked between calls: the application keeps the next offset
    (``PullResult.next_offset``) and commits what it has processed. Thread-safe.
    """

    def __init__(
        self,
        group: str,
        gateway: str = DEFAULT_GATEWAY,
        *,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        tls: ClientTls = False,
        credentials: Credentials | None = None,
    ) -> None:
        check_group(group)
        self.group = group
        self._reader = GatewayReader(
            Connection(
                gateway,
                rpc_timeout_ms=rpc_timeout_ms,
                retry=retry,
                tls=tls,
                credentials=credentials,
            )
        )

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues from its route, sorted by broker and queue id."""
        return self._reader.queues(topic)

    def pull(
        self,
        queue: MessageQueue,
        offset: int,
        max_messages: int = 32,
        expression: str = "*",
        long_poll_timeout_ms: int = 0,
        *,
        min_messages: int = 0,
        min_messages_wait_ms: int = 0,
    ) -> PullResult:
        """Up to ``max_messages`` messages from ``offset`` matching ``expression`` ("*" or
        "TagA || TagB"). With nothing new and ``long_poll_timeout_ms`` > 0 the gateway holds
        the call until a message arrives or the wait ends (then NO_NEW_MESSAGE). With
        ``min_messages`` > 1 and ``min_messages_wait_ms`` > 0 it first holds the call
        while the queue has fewer than ``min_messages`` past ``offset``, up to that wait
        (fuller pulls, as Kafka's fetch.min.bytes and fetch.max.wait.ms)."""
        request = pull_request(
            self.group,
            queue,
            offset,
            max_messages,
            expression,
            long_poll_timeout_ms,
            min_messages=min_messages,
            min_messages_wait_ms=min_messages_wait_ms,
        )
        return self._reader.pull(request, queue)

    def commit(self, queue: MessageQueue, offset: int) -> None:
        """Store ``offset`` (the next message to consume) as the group's offset."""
        self._reader.commit(self.group, queue, offset)

    def send_back(
        self, message: ReceivedMessage, delay_level: int = 0, max_reconsume_times: int = 0
    ) -> SendBackResult:
        """Hand a message this group failed to consume back to its broker (RocketMQ's
        consumer send-back): it is redelivered from the group's retry topic
        ``%RETRY%<group>`` after the group's retry policy's delay (or after
        ``delay_level``'s, when > 0), or stored in ``%DLQ%<group>`` once it was
        reconsumed the group's ``retry_max_times`` (or ``max_reconsume_times``, when > 0)
        or at once with ``delay_level=-1``. Pull the retry topic's queues (and commit
        their offsets) like any topic's to get the redeliveries; ``message.topic`` is
        then the original topic and ``message.attempt`` the delivery attempt."""
        return self._reader.send_back(self.group, message, delay_level, max_reconsume_times)

    def committed(self, queue: MessageQueue) -> int:
        """The group's committed offset, or -1 when it never committed one."""
        return self._reader.committed(self.group, queue)

    def offsets(self, queue: MessageQueue) -> QueueOffsets:
        """The queue's min offset and max offset (the offset of the next message)."""
        return self._reader.offsets(queue)

    def min_offset(self, queue: MessageQueue) -> int:
        return self.offsets(queue).min_offset

    def max_offset(self, queue: MessageQueue) -> int:
        return self.offsets(queue).max_offset

    def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms`` (ms since epoch)."""
        return self._reader.search_offset(queue, timestamp_ms)

    def close(self) -> None:
        self._reader.connection.close()

"""``PullConsumer`` of tide.client.aio, and the gateway calls both asyncio consumers
share; requests and answers are the sync client's (``tide.client._pull_consumer``)."""

from __future__ import annotations

from types import TracebackType

from tide.auth.client import Credentials
from tide.client._convert import check_group, check_topic, from_pull_response
from tide.client._pull_consumer import (
    commit_request,
    committed_request,
    held_ms,
    offsets_request,
    pull_request,
    readable_queues,
    search_request,
    send_back_request,
    send_back_result,
    send_back_what,
)
from tide.client._rpc import DEFAULT_GATEWAY, DEFAULT_RPC_TIMEOUT_MS, ClientTls, RetryPolicy
from tide.client._types import (
    MessageQueue,
    PullResult,
    QueueOffsets,
    ReceivedMessage,
    SendBackResult,
)
from tide.client.aio._connection import AioConnection
from tide.v1 import gateway_pb2, nameserver_pb2


class AioReader:
    """Route, pull, offsets, commit and send-back calls on an :class:`AioConnection`."""

    def __init__(self, connection: AioConnection) -> None:
        self.connection = connection

    async def route(self, topic: str) -> nameserver_pb2.TopicRoute:
        check_topic(topic)
        route: nameserver_pb2.TopicRoute = await self.connection.call(
            self.connection.stub.GetTopicRoute,
            nameserver_pb2.GetTopicRouteRequest(topic=topic),
            f"GetTopicRoute of {topic!r}",
        )
        return route

    async def queues(self, topic: str) -> list[MessageQueue]:
        return readable_queues(await self.route(topic))

    async def pull(self, request: gateway_pb2.PullRequest, queue: MessageQueue) -> PullResult:
        """Cancelling the caller cancels the (long-polling) call."""
        response = await self.connection.call(
            self.connection.stub.Pull,
            request,
            f"Pull from {queue} at {request.offset}",
            extra_timeout_ms=held_ms(request),
        )
        return from_pull_response(queue, response)

    async def offsets(self, queue: MessageQueue) -> QueueOffsets:
        response = await self.connection.call(
            self.connection.stub.GetQueueOffsets,
            offsets_request(queue),
            f"GetQueueOffsets of {queue}",
        )
        return QueueOffsets(response.min_offset, response.max_offset)

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        response = await self.connection.call(
            self.connection.stub.SearchOffset,
            search_request(queue, timestamp_ms),
            f"SearchOffset of {queue} at {timestamp_ms} ms",
        )
        offset: int = response.offset
        return offset

    async def commit(
        self, group: str, queue: MessageQueue, offset: int, *, retry: bool = True
    ) -> None:
        await self.connection.call(
            self.connection.stub.CommitOffset,
            commit_request(group, queue, offset),
            f"CommitOffset of group {group!r} for {queue}",
            retry=retry,
        )

    async def send_back(
        self,
        group: str,
        message: ReceivedMessage,
        delay_level: int = 0,
        max_reconsume_times: int = 0,
        *,
        retry: bool = True,
    ) -> SendBackResult:
        answer = await self.connection.call(
            self.connection.stub.SendBack,
            send_back_request(group, message, delay_level, max_reconsume_times),
            send_back_what(group, message),
            retry=retry,
        )
        return send_back_result(answer)

    async def committed(self, group: str, queue: MessageQueue) -> int:
        response = await self.connection.call(
            self.connection.stub.GetOffset,
            committed_request(group, queue),
            f"GetOffset of group {group!r} for {queue}",
        )
        offset: int = response.offset
        return offset


class PullConsumer:
    """The sync :class:`tide.client.PullConsumer` (the application picks queues and
    offsets; the group stores offsets), with coroutines."""

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
        self._reader = AioReader(
            AioConnection(
                gateway,
                rpc_timeout_ms=rpc_timeout_ms,
                retry=retry,
                tls=tls,
                credentials=credentials,
            )
        )

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues from its route, sorted by broker and queue id."""
        return await self._reader.queues(topic)

    async def pull(
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
        """As the sync ``pull``; cancelling it ends a long poll at once."""
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
        return await self._reader.pull(request, queue)

    async def commit(self, queue: MessageQueue, offset: int) -> None:
        """Store ``offset`` (the next message to consume) as the group's offset."""
        await self._reader.commit(self.group, queue, offset)

    async def send_back(
        self, message: ReceivedMessage, delay_level: int = 0, max_reconsume_times: int = 0
    ) -> SendBackResult:
        """As the sync ``send_back``: to the group's retry topic, or its DLQ."""
        return await self._reader.send_back(self.group, message, delay_level, max_reconsume_times)

    async def committed(self, queue: MessageQueue) -> int:
        """The group's committed offset, or -1 when it never committed one."""
        return await self._reader.committed(self.group, queue)

    async def offsets(self, queue: MessageQueue) -> QueueOffsets:
        return await self._reader.offsets(queue)

    async def min_offset(self, queue: MessageQueue) -> int:
        return (await self.offsets(queue)).min_offset

    async def max_offset(self, queue: MessageQueue) -> int:
        return (await self.offsets(queue)).max_offset

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms`` (ms since epoch)."""
        return await self._reader.search_offset(queue, timestamp_ms)

    async def close(self) -> None:
        """Idempotent."""
        await self._reader.connection.close()

    async def __aenter__(self) -> PullConsumer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

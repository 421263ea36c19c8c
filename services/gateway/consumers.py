"""Queue offsets (dispatch), consumer offsets (storage) and group membership (storage).

Queue offsets, search by time and GetOffset are reads: the broker's master, or its slave
while the master is unreachable (readers.py; a slave's consumer offsets are the master's
as of its last metadata sync). Commits go to the master only: with the master down,
CommitOffset answers UNAVAILABLE ("consumer offsets live on the master of broker-a; retry
when it is back") and consumers keep their position in memory.

Membership: a heartbeat goes to every master broker of the clusters serving the
subscribed topics (every master the name servers know when none of the topics is known);
GetConsumers asks every master and merges the members (the latest heartbeat of each
client wins). A broker that fails is skipped while another answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from services.gateway.brokers import BrokerChannels, BrokerUnreachable, broker_error
from services.gateway.expression import ExpressionError, parse_expression
from services.gateway.options import GatewayConfig
from services.gateway.pull import QueueTarget, read_queue, readable_queue
from services.gateway.readers import ReadMembers
from services.gateway.routes import MASTER_ID, Member, RouteCache, masters_of
from services.gateway.validate import (
    check_group,
    check_queue,
    check_topic,
    invalid,
)
from tide.limits import CLIENT_ID_MAX_CHARS, SUBSCRIPTIONS_MAX_COUNT, limit_text
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

log = logging.getLogger("tide.gateway.consumers")

_T = TypeVar("_T")


class Consumers:
    def __init__(
        self,
        config: GatewayConfig,
        routes: RouteCache,
        channels: BrokerChannels,
        members: ReadMembers,
    ) -> None:
        self._config = config
        self._routes = routes
        self._channels = channels
        self._members = members

    async def _queue(self, topic: str, broker_name: str, queue_id: int) -> QueueTarget:
        check_queue(topic, broker_name, queue_id)
        return await readable_queue(self._routes, topic, broker_name, queue_id)

    # -- queue offsets (dispatch) --------------------------------------------------
    async def queue_offsets(self, request: pb.QueueOffsetsRequest) -> pb.QueueOffsetsResponse:
        target = await self._queue(request.topic, request.broker_name, request.queue_id)
        offsets_request = dispatch_pb.GetQueueOffsetsRequest(
            topic=target.topic, queue_id=target.queue_id
        )

        async def call(member: Member) -> pb.QueueOffsetsResponse:
            try:
                offsets: dispatch_pb.GetQueueOffsetsResponse = await self._channels.dispatch(
                    member.dispatch
                ).GetQueueOffsets(offsets_request, timeout=self._config.broker_timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.NOT_FOUND:  # nothing dispatched to it yet
                    return pb.QueueOffsetsResponse(min_offset=0, max_offset=0)
                raise broker_error(exc, _where("GetQueueOffsets", target, member)) from exc
            return pb.QueueOffsetsResponse(
                min_offset=offsets.min_offset, max_offset=offsets.max_offset
            )

        answer, _ = await read_queue(self._routes, self._members, target, call)
        return answer

    async def search_offset(
        self, request: pb.SearchQueueOffsetRequest
    ) -> pb.SearchQueueOffsetResponse:
        if request.timestamp_ms < 0:
            raise invalid(f"timestamp_ms must be >= 0 (got {request.timestamp_ms})")
        target = await self._queue(request.topic, request.broker_name, request.queue_id)
        search = dispatch_pb.SearchOffsetRequest(
            topic=target.topic, queue_id=target.queue_id, timestamp_ms=request.timestamp_ms
        )

        async def call(member: Member) -> pb.SearchQueueOffsetResponse:
            try:
                found: dispatch_pb.SearchOffsetResponse = await self._channels.dispatch(
                    member.dispatch
                ).SearchOffset(search, timeout=self._config.broker_timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.NOT_FOUND:
                    return pb.SearchQueueOffsetResponse(offset=0)
                raise broker_error(exc, _where("SearchOffset", target, member)) from exc
            return pb.SearchQueueOffsetResponse(offset=found.offset)

        answer, _ = await read_queue(self._routes, self._members, target, call)
        return answer

    # -- consumer offsets (the broker's master storage) -----------------------------
    async def _master(self, topic: str, broker_name: str, queue_id: int) -> Member:
        check_queue(topic, broker_name, queue_id)
        target = await readable_queue(self._routes, topic, broker_name, queue_id)
        member = next((m for m in target.members if m.broker_id == MASTER_ID), None)
        if member is None:
            raise _master_down(target.broker_name, "its master is not in the route")
        return member

    async def commit_offset(
        self, request: pb.CommitConsumerOffsetRequest
    ) -> pb.CommitConsumerOffsetResponse:
        check_group(request.consumer_group)
        if request.offset < 0:
            raise invalid(f"offset must be >= 0 (got {request.offset})")
        member = await self._master(request.topic, request.broker_name, request.queue_id)
        try:
            await self._channels.storage(member.storage).CommitOffset(
                storage_pb.CommitOffsetRequest(
                    consumer_group=request.consumer_group,
                    topic=request.topic,
                    queue_id=request.queue_id,
                    offset=request.offset,
                ),
                timeout=self._config.broker_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.INVALID_ARGUMENT:  # past the queue's max
                raise await self._refused_commit(request, exc) from exc
            raise _offsets_error(exc, "CommitOffset", member) from exc
        return pb.CommitConsumerOffsetResponse()

    async def _refused_commit(
        self, request: pb.CommitConsumerOffsetRequest, exc: grpc.aio.AioRpcError
    ) -> ServiceError:
        """The storage's refusal (an offset past the queue's max: the storage assigns
        queue offsets, so it knows the true max) with the queue's min and max offsets as
        the dispatch serves them, to say what a valid commit is."""
        try:
            offsets = await self.queue_offsets(
                pb.QueueOffsetsRequest(
                    topic=request.topic, broker_name=request.broker_name, queue_id=request.queue_id
                )
            )
        except ServiceError:
            return invalid(f"CommitOffset: {exc.details()}")
        return invalid(
            f"CommitOffset: {exc.details()} (the queue's min offset is {offsets.min_offset}, "
            f"its max offset {offsets.max_offset})"
        )

    async def get_offset(
        self, request: pb.GetConsumerOffsetRequest
    ) -> pb.GetConsumerOffsetResponse:
        """A read like the queue offsets: the master, or its slave while the master is
        unreachable (the slave holds a copy of the master's offsets from its metadata
        sync, at most one sync interval old), so a consumer restarted during the master's
        outage resumes where the group was instead of at its consume-from point."""
        check_group(request.consumer_group)
        target = await self._queue(request.topic, request.broker_name, request.queue_id)
        get = storage_pb.GetOffsetRequest(
            consumer_group=request.consumer_group,
            topic=request.topic,
            queue_id=request.queue_id,
        )

        async def call(member: Member) -> pb.GetConsumerOffsetResponse:
            try:
                answer: storage_pb.GetOffsetResponse = await self._channels.storage(
                    member.storage
                ).GetOffset(get, timeout=self._config.broker_timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise broker_error(
                    exc, f"GetOffset on broker {member.broker_name} ({member.storage})"
                ) from exc
            return pb.GetConsumerOffsetResponse(offset=answer.offset)

        answer, _ = await read_queue(self._routes, self._members, target, call)
        return answer

    # -- membership ----------------------------------------------------------------
    async def heartbeat(
        self, request: storage_pb.ConsumerHeartbeatRequest
    ) -> storage_pb.ConsumerHeartbeatResponse:
        check_group(request.consumer_group)
        _check_client_id(request.client_id)
        if len(request.subscriptions) > SUBSCRIPTIONS_MAX_COUNT:
            raise invalid(
                f"{len(request.subscriptions)} subscriptions; the limit is "
                f"{limit_text('SUBSCRIPTIONS_MAX_COUNT')}"
            )
        clusters: set[str] = set()
        for index, subscription in enumerate(request.subscriptions):
            check_topic(subscription.topic, f"subscriptions[{index}].topic")
            try:
                parse_expression(subscription.expression)
            except ExpressionError as exc:
                raise invalid(f"subscriptions[{index}].expression: {exc}") from exc
            try:
                view = await self._routes.get(subscription.topic)
            except ServiceError as exc:
                if exc.code is not grpc.StatusCode.NOT_FOUND:
                    raise
                continue  # not created yet: the members of the known topics' clusters
            clusters.update(
                view.cluster_of[name] for name in view.queue_data if name in view.cluster_of
            )
        info = await self._routes.cluster_info()
        targets = masters_of(info, clusters or None)
        answers = await self._on_all(
            targets,
            "ConsumerHeartbeat",
            lambda member: self._channels.storage(member.storage).ConsumerHeartbeat(
                request, timeout=self._config.broker_timeout_s
            ),
        )
        return storage_pb.ConsumerHeartbeatResponse(
            expiry_ms=min(answer.expiry_ms for answer in answers)
        )

    async def unregister(
        self, request: storage_pb.UnregisterConsumerRequest
    ) -> storage_pb.UnregisterConsumerResponse:
        check_group(request.consumer_group)
        _check_client_id(request.client_id)
        targets = masters_of(await self._routes.cluster_info())
        answers = await self._on_all(
            targets,
            "UnregisterConsumer",
            lambda member: self._channels.storage(member.storage).UnregisterConsumer(
                request, timeout=self._config.broker_timeout_s
            ),
        )
        return storage_pb.UnregisterConsumerResponse(existed=any(a.existed for a in answers))

    async def consumers(
        self, request: storage_pb.GetConsumersRequest
    ) -> storage_pb.GetConsumersResponse:
        check_group(request.consumer_group)
        targets = masters_of(await self._routes.cluster_info())
        answers = await self._on_all(
            targets,
            "GetConsumers",
            lambda member: self._channels.storage(member.storage).GetConsumers(
                request, timeout=self._config.broker_timeout_s
            ),
        )
        members: dict[str, storage_pb.ConsumerMember] = {}
        for answer in answers:
            for member in answer.members:
                known = members.get(member.client_id)
                if known is None or member.last_heartbeat_ms > known.last_heartbeat_ms:
                    members[member.client_id] = member
        return storage_pb.GetConsumersResponse(
            members=[members[client_id] for client_id in sorted(members)]
        )

    async def _on_all(
        self, targets: list[Member], call: str, send: Callable[[Member], Awaitable[_T]]
    ) -> list[_T]:
        """``send`` to every target concurrently; the answers of those that answered.
        Fails only when none answered (with the first failure)."""
        if not targets:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                "no master broker is registered with the name servers; start a broker first",
            )
        outcomes = await asyncio.gather(
            *(send(member) for member in targets), return_exceptions=True
        )
        answers: list[_T] = []
        first: ServiceError | None = None
        for member, outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, grpc.aio.AioRpcError):
                error = broker_error(outcome, f"{call} on broker {member.broker_name}")
                log.warning("%s", error.message)
                first = first or error
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                answers.append(outcome)
        if not answers:
            assert first is not None
            raise first
        return answers


def _check_client_id(client_id: str) -> None:
    if not client_id:
        raise invalid("client_id is empty; give each consumer instance a unique id")
    if len(client_id) > CLIENT_ID_MAX_CHARS:
        raise invalid(
            f"client_id is {len(client_id)} characters; the limit is "
            f"{limit_text('CLIENT_ID_MAX_CHARS')}"
        )


def _where(call: str, target: QueueTarget, member: Member) -> str:
    role = "master" if member.broker_id == MASTER_ID else f"slave {member.broker_id}"
    return f"{call} on broker {target.broker_name} {role} ({member.dispatch})"


def _master_down(broker_name: str, why: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.UNAVAILABLE,
        f"consumer offsets live on the master of {broker_name}; retry when it is back ({why})",
    )


def _offsets_error(exc: grpc.aio.AioRpcError, call: str, member: Member) -> ServiceError:
    error = broker_error(exc, f"{call} on broker {member.broker_name} ({member.storage})")
    if isinstance(error, BrokerUnreachable):
        return _master_down(member.broker_name, error.message)
    return error

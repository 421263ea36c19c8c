"""Topic admin through the gateway: create / delete on the brokers, then wait (bounded)
until a name server's route shows the change; lists, routes and cluster info from the
name servers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from services.gateway.brokers import BrokerChannels, broker_error
from services.gateway.cluster_status import with_status
from services.gateway.groups import GroupAdmin
from services.gateway.options import MAX_QUEUE_NUMS, GatewayConfig
from services.gateway.routes import Member, RouteCache, TopicView, masters_of
from services.gateway.validate import check_topic, invalid
from tide.format import TOPIC_MESSAGE_TYPE_ATTRIBUTE, TopicMessageType, is_system_topic
from tide.quoting import quote, quote_all
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb
from tide.v1 import nameserver_pb2 as ns_pb
from tide.v1 import storage_pb2 as storage_pb

log = logging.getLogger("tide.gateway.admin")

DEFAULT_QUEUE_NUMS = 4
DEFAULT_PERM = 6
MAX_PERM = 7
ROUTE_POLL_INTERVAL_S = 0.05
# The types a topic may be given (UNSPECIFIED is a message's, never a topic's).
CREATABLE_TYPES = tuple(t.value for t in TopicMessageType if t is not TopicMessageType.UNSPECIFIED)


class Admin:
    def __init__(self, config: GatewayConfig, routes: RouteCache, channels: BrokerChannels) -> None:
        self._config = config
        self._routes = routes
        self._channels = channels
        self.groups = GroupAdmin(channels, self._targets, config.broker_timeout_s)

    # -- create --------------------------------------------------------------------
    async def create_topic(self, request: pb.CreateTopicRequest) -> pb.CreateTopicResponse:
        check_topic(request.topic)
        _check_not_system(request.topic, "created")
        topic = storage_pb.TopicConfig(
            topic_name=request.topic,
            read_queue_nums=_queue_nums(request.read_queue_nums, "read_queue_nums"),
            write_queue_nums=_queue_nums(request.write_queue_nums, "write_queue_nums"),
            perm=request.perm or DEFAULT_PERM,
            order=request.order,
            attributes=_type_attributes(request.message_type),
        )
        if not 0 < topic.perm <= MAX_PERM:
            raise invalid(f"perm must be in 1..{MAX_PERM}: bits 2 write, 4 read (got {topic.perm})")
        targets = await self._targets(list(request.broker_names), request.cluster_name)
        await self._upsert(topic, targets)
        await self._wait_route(request.topic, lambda view: _shows(view, topic, targets))
        return pb.CreateTopicResponse(broker_names=[member.broker_name for member in targets])

    async def auto_create(self, topic: str) -> TopicView:
        """Create ``topic`` with the default queue numbers on every master broker."""
        nums = self._config.default_queue_nums
        config = storage_pb.TopicConfig(
            topic_name=topic, read_queue_nums=nums, write_queue_nums=nums, perm=DEFAULT_PERM
        )
        targets = await self._targets([], "")
        await self._upsert(config, targets)
        return await self._wait_route(topic, lambda view: _shows(view, config, targets))

    async def _targets(self, broker_names: list[str], cluster_name: str) -> list[Member]:
        info = await self._routes.cluster_info(refresh=True)
        live = masters_of(info)
        if cluster_name:
            if cluster_name not in info.clusters:
                raise ServiceError(
                    grpc.StatusCode.NOT_FOUND,
                    f"cluster_name {quote(cluster_name)} is unknown (clusters: "
                    f"{', '.join(sorted(info.clusters)) or 'none'})",
                )
            live = masters_of(info, [cluster_name])
        if broker_names:
            by_name = {member.broker_name: member for member in live}
            unknown = [name for name in broker_names if name not in by_name]
            if unknown:
                where = f" of cluster {quote(cluster_name)}" if cluster_name else ""
                raise ServiceError(
                    grpc.StatusCode.NOT_FOUND,
                    f"broker_names: {quote_all(unknown)} is not a live master "
                    f"broker{where} (live: {quote_all(sorted(by_name)) or 'none'})",
                )
            live = [by_name[name] for name in sorted(set(broker_names))]
        if not live:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                "no master broker is registered with the name servers; start a broker first",
            )
        return live

    async def _upsert(self, topic: storage_pb.TopicConfig, targets: list[Member]) -> None:
        request = storage_pb.UpsertTopicRequest(topic=topic)

        async def upsert(member: Member) -> None:
            try:
                await self._channels.storage(member.storage).UpsertTopic(
                    request, timeout=self._config.broker_timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                raise broker_error(
                    exc, f"UpsertTopic on broker {member.broker_name} ({member.storage})"
                ) from exc

        outcomes = await asyncio.gather(
            *(upsert(member) for member in targets), return_exceptions=True
        )
        failed = [
            (member, outcome)
            for member, outcome in zip(targets, outcomes, strict=True)
            if isinstance(outcome, BaseException)
        ]
        if not failed:
            return
        done = [member.broker_name for member in targets if member not in {m for m, _ in failed}]
        first = failed[0][1]
        if not isinstance(first, ServiceError):
            raise first
        suffix = f" (done on: {', '.join(done)}; run it again)" if done else ""
        raise ServiceError(first.code, first.message + suffix)

    # -- delete --------------------------------------------------------------------
    async def delete_topic(
        self, request: storage_pb.DeleteTopicRequest
    ) -> storage_pb.DeleteTopicResponse:
        check_topic(request.topic)
        _check_not_system(request.topic, "deleted")
        view = await self._routes.get(request.topic, refresh=True)
        members = view.all_members()

        async def delete(member: Member) -> bool:
            try:
                answer: storage_pb.DeleteTopicResponse = await self._channels.storage(
                    member.storage
                ).DeleteTopic(request, timeout=self._config.broker_timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.NOT_FOUND:
                    return False
                raise broker_error(
                    exc, f"DeleteTopic on broker {member.broker_name} ({member.storage})"
                ) from exc
            return answer.existed

        existed = await asyncio.gather(*(delete(member) for member in members))
        names = {member.broker_name for member in members}
        await self._wait_route(
            request.topic, lambda seen: not names & set(seen.queue_data), gone_ok=True
        )
        self._routes.invalidate(request.topic)
        return storage_pb.DeleteTopicResponse(existed=any(existed))

    # -- waiting for the name servers ------------------------------------------------
    async def _wait_route(
        self, topic: str, done: Callable[[TopicView], bool], *, gone_ok: bool = False
    ) -> TopicView:
        """Poll the route until ``done(view)`` (or, with ``gone_ok``, NOT_FOUND); at most
        ``--topic-create-wait-ms``."""
        deadline = time.monotonic() + self._config.topic_create_wait_s
        last = "no answer yet"
        while True:
            try:
                view = await self._routes.get(topic, refresh=True)
            except ServiceError as exc:
                if exc.code is not grpc.StatusCode.NOT_FOUND:
                    raise
                if gone_ok:
                    return TopicView(ns_pb.TopicRoute(topic=topic))
                last = "the topic is not in the route yet"
            else:
                if done(view):
                    return view
                last = f"route shows brokers {', '.join(sorted(view.queue_data)) or 'none'}"
            if time.monotonic() >= deadline:
                raise ServiceError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"topic {quote(topic)}: the brokers made the change but the name servers "
                    f"do not show it after {self._config.topic_create_wait_s:g} s ({last}); "
                    "brokers register on every topic change and every --register-interval-ms: "
                    "check they reach the name servers",
                )
            await asyncio.sleep(ROUTE_POLL_INTERVAL_S)

    # -- reads ---------------------------------------------------------------------
    async def list_topics(self, include_hidden: bool) -> ns_pb.ListRouteTopicsResponse:
        return await self._routes.namesrv.list_topics(include_hidden)

    async def topic_route(self, request: ns_pb.GetTopicRouteRequest) -> ns_pb.TopicRoute:
        check_topic(request.topic)
        view = await self._routes.get(request.topic, refresh=True)
        return view.route

    async def cluster_info(self, request: ns_pb.GetClusterInfoRequest) -> ns_pb.ClusterInfo:
        info = await self._routes.cluster_info(refresh=True)
        if not request.with_status:
            return info
        return await with_status(info, self._channels, self._config.broker_timeout_s)


def _queue_nums(value: int, field: str) -> int:
    value = value or DEFAULT_QUEUE_NUMS
    if not 1 <= value <= MAX_QUEUE_NUMS:
        raise invalid(f"{field} must be in 1..{MAX_QUEUE_NUMS} (0 means {DEFAULT_QUEUE_NUMS})")
    return value


def _check_not_system(topic: str, done: str) -> None:
    """RocketMQ's validateSystemTopicWhenUpdateTopic: the storages keep their system
    topics (docs/delivery.md, "System topics")."""
    if is_system_topic(topic):
        raise invalid(
            f"topic {quote(topic)} is a system topic every storage keeps; it cannot be {done} "
            "through the admin API"
        )


def _type_attributes(message_type: str) -> dict[str, str]:
    """The topic attributes for CreateTopicRequest.message_type (empty: none, NORMAL)."""
    if not message_type:
        return {}
    if message_type not in CREATABLE_TYPES:
        raise invalid(
            f"message_type is {quote(message_type)}; it must be one of "
            f"{', '.join(CREATABLE_TYPES)} (empty means NORMAL)"
        )
    return {TOPIC_MESSAGE_TYPE_ATTRIBUTE: message_type}


def _shows(view: TopicView, topic: storage_pb.TopicConfig, targets: list[Member]) -> bool:
    message_type = topic.attributes.get(TOPIC_MESSAGE_TYPE_ATTRIBUTE, "NORMAL")
    for member in targets:
        data = view.queue_data.get(member.broker_name)
        if (
            data is None
            or data.read_queue_nums != topic.read_queue_nums
            or data.write_queue_nums != topic.write_queue_nums
            or data.perm != topic.perm
            or (data.message_type or "NORMAL") != message_type
        ):
            return False
    return True

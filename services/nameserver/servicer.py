"""``tide.v1.NameServer`` over the route tables: request checks, status codes, conversions.

Handlers run on the asyncio loop; the table calls are short (in-memory, under the
readers-writer lock the expiry scan also takes).
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from services.nameserver import route_info as routes
from tide.format import TopicMessageType, is_hidden_topic, topic_message_type
from tide.limits import QUEUE_NUMS_MAX
from tide.naming import topic_error
from tide.quoting import quote
from tide.registration import (
    MAX_HEARTBEAT_TIMEOUT_MS,
    address_error,
    broker_id_error,
    name_error,
)
from tide.server import ServiceError
from tide.v1 import nameserver_pb2 as pb
from tide.v1 import nameserver_pb2_grpc as pb_grpc
from tide.v1 import storage_pb2 as storage_pb

# The storage's topic table limits (a registration outside them is malformed).
MAX_QUEUE_NUMS = QUEUE_NUMS_MAX  # one limit for every service (tide.limits)
MAX_PERM = 7
MAX_TOPIC_SYS_FLAG = 2**31 - 1


def _invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _check(error: str | None) -> None:
    if error is not None:
        raise _invalid(error)


def _check_member(cluster_name: str, broker_name: str, broker_id: int, storage: str) -> None:
    _check(name_error("cluster_name", cluster_name))
    _check(name_error("broker_name", broker_name))
    _check(broker_id_error(broker_id))
    _check(address_error("address.storage", storage))


def _queue_data(broker_name: str, index: int, topic: storage_pb.TopicConfig) -> routes.QueueData:
    where = f"topics[{index}]"
    error = topic_error(topic.topic_name)
    if error is not None:
        raise _invalid(f"{where}: {error}")
    for label, nums in (
        ("read_queue_nums", topic.read_queue_nums),
        ("write_queue_nums", topic.write_queue_nums),
    ):
        if not 0 <= nums <= MAX_QUEUE_NUMS:
            raise _invalid(f"{where} ({topic.topic_name}): {label} is {nums}; it must be 0..1024")
    if not 0 <= topic.perm <= MAX_PERM:
        raise _invalid(
            f"{where} ({topic.topic_name}): perm is {topic.perm}; it must be 0..7 "
            "(bits: 4 read, 2 write, 1 inherit)"
        )
    if not 0 <= topic.topic_sys_flag <= MAX_TOPIC_SYS_FLAG:
        raise _invalid(f"{where} ({topic.topic_name}): topic_sys_flag must be >= 0")
    try:
        message_type = topic_message_type(topic.attributes)
    except ValueError as exc:
        raise _invalid(f"{where} ({topic.topic_name}): attributes: {exc}") from None
    return routes.QueueData(
        broker_name=broker_name,
        read_queue_nums=topic.read_queue_nums,
        write_queue_nums=topic.write_queue_nums,
        perm=topic.perm,
        topic_sys_flag=topic.topic_sys_flag,
        order=topic.order,
        message_type=message_type.value,
    )


def registration(request: pb.RegisterBrokerRequest, max_topics: int) -> routes.Registration:
    """Check a RegisterBrokerRequest field by field and convert it (the topics' count
    first: like every bound, before the fields' contents)."""
    if len(request.topics) > max_topics:
        raise ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the registration lists {len(request.topics)} topics; this name server takes "
            f"at most {max_topics} (--max-topics-per-registration)",
        )
    address = request.address
    _check_member(request.cluster_name, request.broker_name, request.broker_id, address.storage)
    if address.dispatch:
        _check(address_error("address.dispatch", address.dispatch))
    if not 0 <= request.heartbeat_timeout_ms <= MAX_HEARTBEAT_TIMEOUT_MS:
        raise _invalid(
            f"heartbeat_timeout_ms is {request.heartbeat_timeout_ms}; it must be "
            f"0 (the name server's default) .. {MAX_HEARTBEAT_TIMEOUT_MS}"
        )
    version = request.data_version
    if version.timestamp_ms < 0 or version.counter < 0:
        raise _invalid("data_version.timestamp_ms and data_version.counter must be >= 0")
    topics: dict[str, routes.QueueData] = {}
    for index, topic in enumerate(request.topics):
        if topic.topic_name in topics:
            raise _invalid(f"topics[{index}]: topic {quote(topic.topic_name)} is listed twice")
        topics[topic.topic_name] = _queue_data(request.broker_name, index, topic)
    return routes.Registration(
        cluster_name=request.cluster_name,
        broker_name=request.broker_name,
        broker_id=request.broker_id,
        address=routes.BrokerAddress(address.storage, address.dispatch),
        topics=topics,
        data_version=(version.timestamp_ms, version.counter),
        heartbeat_timeout_ms=request.heartbeat_timeout_ms,
    )


def _address_pb(address: routes.BrokerAddress) -> pb.BrokerAddress:
    return pb.BrokerAddress(storage=address.storage, dispatch=address.dispatch)


def _version_pb(version: routes.DataVersion) -> pb.DataVersion:
    return pb.DataVersion(timestamp_ms=version[0], counter=version[1])


def _broker_data_pb(data: routes.BrokerData) -> pb.BrokerData:
    return pb.BrokerData(
        cluster_name=data.cluster_name,
        broker_name=data.broker_name,
        addresses={broker_id: _address_pb(a) for broker_id, a in data.addresses.items()},
    )


def route_pb(route: routes.TopicRoute) -> pb.TopicRoute:
    return pb.TopicRoute(
        topic=route.topic,
        queue_datas=[
            pb.QueueData(
                broker_name=q.broker_name,
                read_queue_nums=q.read_queue_nums,
                write_queue_nums=q.write_queue_nums,
                perm=q.perm,
                topic_sys_flag=q.topic_sys_flag,
                message_type=q.message_type,
            )
            for q in route.queue_datas
        ],
        broker_datas=[_broker_data_pb(b) for b in route.broker_datas],
        order=route.order,
        message_type=route_message_type(route.queue_datas),
    )


def route_message_type(queue_datas: list[routes.QueueData]) -> str:
    return _one_type({q.message_type for q in queue_datas})


def _one_type(types: set[str]) -> str:
    """The brokers' one type; MIXED when they disagree, NORMAL for no broker."""
    if len(types) > 1:
        return TopicMessageType.MIXED.value
    return types.pop() if types else TopicMessageType.NORMAL.value


def cluster_info_pb(info: routes.ClusterInfo) -> pb.ClusterInfo:
    return pb.ClusterInfo(
        clusters={name: pb.ClusterBrokers(broker_names=b) for name, b in info.clusters.items()},
        brokers=[
            pb.BrokerLiveInfo(
                cluster_name=live.cluster_name,
                broker_name=live.broker_name,
                broker_id=live.broker_id,
                address=_address_pb(live.address),
                last_update_ms=live.last_update_ms,
                heartbeat_timeout_ms=live.heartbeat_timeout_ms,
                data_version=_version_pb(live.data_version),
                topic_count=live.topic_count,
            )
            for live in info.brokers
        ],
    )


class NameServerServicer(pb_grpc.NameServerServicer):
    def __init__(self, routes_provider: Callable[[], routes.RouteInfo]) -> None:
        self._routes = routes_provider

    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.RegisterBrokerResponse:
        table = self._routes()
        reg = registration(request, table.max_topics_per_registration)
        try:
            master = table.register(reg)
        except routes.RouteLimitError as exc:
            raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from exc
        except routes.RouteConflictError as exc:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc
        return pb.RegisterBrokerResponse(master_address=master)

    async def UnregisterBroker(
        self,
        request: pb.UnregisterBrokerRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.UnregisterBrokerResponse:
        _check_member(
            request.cluster_name, request.broker_name, request.broker_id, request.storage_address
        )
        existed = self._routes().unregister(
            request.cluster_name, request.broker_name, request.broker_id, request.storage_address
        )
        return pb.UnregisterBrokerResponse(existed=existed)

    async def GetTopicRoute(
        self, request: pb.GetTopicRouteRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.TopicRoute:
        _check(topic_error(request.topic))
        route = self._routes().topic_route(request.topic)
        if route is None:
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND,
                f"topic {request.topic} has no route: no live broker serves it "
                f"(create it with `tide topic create {request.topic}`)",
            )
        return route_pb(route)

    async def GetClusterInfo(
        self, request: pb.GetClusterInfoRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ClusterInfo:
        return cluster_info_pb(self._routes().cluster_info())

    async def ListRouteTopics(
        self,
        request: pb.ListRouteTopicsRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.ListRouteTopicsResponse:
        listed = self._routes().topic_types()
        if not request.include_hidden:  # system, retry and dead-letter topics
            listed = [entry for entry in listed if not is_hidden_topic(entry[0])]
        return pb.ListRouteTopicsResponse(
            topics=[topic for topic, _ in listed],
            message_types=[_one_type(types) for _, types in listed],
        )

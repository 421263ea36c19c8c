"""QueryRoute and QueryAssignment: a topic's queues as the v2 clients want them.

Every queue's broker is this gateway (the clients send every call to the endpoint they
were given; the gateway routes to the brokers), named by the Tide broker that holds the
queue, with id 0 (the master: the clients skip other ids) and the endpoint the client
reached the gateway by (its request's ``endpoints``), else the gateway's own address.
Each queue lists the message types the topic accepts (the clients refuse to send any
other): the topic's type, every type for a MIXED topic.
"""

from __future__ import annotations

import ipaddress

from services.gateway.routes import MASTER_ID, PERM_READ, PERM_WRITE, RouteCache, TopicView
from services.gateway.v2.status import OK, V2Error, group_of, status_of, topic_of
from tide.format import TopicMessageType
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s

_ACCEPTED: dict[TopicMessageType, list[v2.MessageType.ValueType]] = {
    TopicMessageType.NORMAL: [v2.NORMAL],
    TopicMessageType.UNSPECIFIED: [v2.NORMAL],
    TopicMessageType.FIFO: [v2.FIFO],
    TopicMessageType.DELAY: [v2.DELAY],
    TopicMessageType.TRANSACTION: [v2.TRANSACTION],
    TopicMessageType.MIXED: [v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION],
}


def accepted_types(topic_type: TopicMessageType) -> list[v2.MessageType.ValueType]:
    """The message types a topic of ``topic_type`` takes."""
    return _ACCEPTED.get(topic_type, [v2.NORMAL])


def endpoints_of(address: str) -> v2.Endpoints:
    """``HOST:PORT`` (``[::1]:PORT``) as v2 endpoints with the scheme the host is."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        version = ipaddress.ip_address(host).version
    except ValueError:
        scheme = v2.DOMAIN_NAME
    else:
        scheme = v2.IPv4 if version == 4 else v2.IPv6
    return v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=host, port=int(port or 0))])


def _endpoints(asked: v2.Endpoints, own: str) -> v2.Endpoints:
    if asked.addresses and asked.addresses[0].host:
        answer = v2.Endpoints()
        answer.CopyFrom(asked)
        if answer.scheme == v2.ADDRESS_SCHEME_UNSPECIFIED:  # the clients need a scheme
            answer.scheme = endpoints_of(f"{asked.addresses[0].host}:0").scheme
        return answer
    return endpoints_of(own)


def _permission(perm: int) -> v2.Permission.ValueType:
    readable, writable = bool(perm & PERM_READ), bool(perm & PERM_WRITE)
    if readable and writable:
        return v2.READ_WRITE
    return v2.READ if readable else v2.WRITE if writable else v2.NONE


class V2Routes:
    def __init__(self, routes: RouteCache, own_endpoint: list[str]) -> None:
        self._routes = routes
        # Filled by the gateway's start (the bound address: port 0 picks one).
        self._own_endpoint = own_endpoint

    async def view(self, topic: str) -> TopicView:
        return await self._routes.get(topic)

    async def query_route(self, request: v2s.QueryRouteRequest) -> v2s.QueryRouteResponse:
        try:
            topic = topic_of(request.topic)
            view = await self._routes.get(topic)
        except Exception as exc:
            return v2s.QueryRouteResponse(status=status_of(exc, v2.TOPIC_NOT_FOUND))
        endpoints = _endpoints(request.endpoints, self._own())
        queues = []
        accepted = accepted_types(view.message_type)
        for broker_name in sorted(view.queue_data):
            data = view.queue_data[broker_name]
            if view.master(broker_name) is None:
                continue  # no master: nothing to send to or receive from there now
            broker = v2.Broker(name=broker_name, id=MASTER_ID, endpoints=endpoints)
            for queue_id in range(max(data.read_queue_nums, data.write_queue_nums)):
                perm = data.perm
                if queue_id >= data.read_queue_nums:
                    perm &= ~PERM_READ
                if queue_id >= data.write_queue_nums:
                    perm &= ~PERM_WRITE
                queues.append(
                    v2.MessageQueue(
                        topic=v2.Resource(name=topic),
                        id=queue_id,
                        permission=_permission(perm),
                        broker=broker,
                        accept_message_types=accepted,
                    )
                )
        return v2s.QueryRouteResponse(status=OK, message_queues=queues)

    async def query_assignment(
        self, request: v2s.QueryAssignmentRequest
    ) -> v2s.QueryAssignmentResponse:
        """One assignment per broker with readable queues, queue id -1 (all of them): POP
        needs no client-side rebalancing."""
        try:
            topic = topic_of(request.topic)
            group_of(request.group)
            view = await self._routes.get(topic)
        except Exception as exc:
            return v2s.QueryAssignmentResponse(status=status_of(exc, v2.TOPIC_NOT_FOUND))
        endpoints = _endpoints(request.endpoints, self._own())
        assignments = []
        for broker_name in sorted(view.queue_data):
            data = view.queue_data[broker_name]
            if not data.perm & PERM_READ or not data.read_queue_nums:
                continue
            if view.master(broker_name) is None:
                continue
            queue = v2.MessageQueue(
                topic=v2.Resource(name=topic),
                id=-1,
                permission=v2.READ_WRITE,
                broker=v2.Broker(name=broker_name, id=MASTER_ID, endpoints=endpoints),
                accept_message_types=accepted_types(view.message_type),
            )
            assignments.append(v2.Assignment(message_queue=queue))
        if not assignments:
            return v2s.QueryAssignmentResponse(
                status=status_of(
                    V2Error(v2.FORBIDDEN, f"topic {topic} has no readable queue with a master")
                )
            )
        return v2s.QueryAssignmentResponse(status=OK, assignments=assignments)

    def _own(self) -> str:
        return self._own_endpoint[0] if self._own_endpoint else "127.0.0.1:0"

"""The gateway's client of the name servers: any live one answers.

Name servers are independent replicas with the same tables (every broker registers with
each). A call goes to the name server that answered last; when it cannot be reached the
others are tried in turn. A topic one name server does not know is also asked of the
others (a broker may not have reached every name server yet).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from services.gateway.brokers import CHANNEL_OPTIONS, rpc_problem
from tide.quoting import quote
from tide.server import ServiceError, cluster_channel_interceptors
from tide.v1 import nameserver_pb2 as ns_pb
from tide.v1 import nameserver_pb2_grpc as ns_grpc

log = logging.getLogger("tide.gateway.namesrv")
_T = TypeVar("_T")

# Answers that say "this name server is not usable now": try the next one.
_TRY_NEXT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


def topic_not_found(topic: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.NOT_FOUND,
        f"topic {quote(topic)} does not exist (no live broker serves it); create it with "
        f"`tide topic create {topic}` (or the CreateTopic call) first",
    )


class NameServerClient:
    def __init__(self, addresses: Sequence[str], timeout_s: float) -> None:
        if not addresses:
            raise ValueError("no name server address")
        self.addresses = tuple(addresses)
        self._timeout_s = timeout_s
        # Channels are made on the event loop, at first use (a grpc.aio channel belongs to
        # the loop it was made on).
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[ns_grpc.NameServerAsyncStub] = []
        self._preferred = 0

    def _connect(self) -> list[ns_grpc.NameServerAsyncStub]:
        if not self._stubs:
            self._channels = [
                grpc.aio.insecure_channel(
                    address,
                    options=list(CHANNEL_OPTIONS),
                    interceptors=cluster_channel_interceptors() or None,
                )
                for address in self.addresses
            ]
            self._stubs = [ns_grpc.NameServerStub(channel) for channel in self._channels]
        return self._stubs

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, [], []
        for channel in channels:
            await channel.close(None)

    async def _call(
        self,
        what: str,
        call: Callable[[ns_grpc.NameServerAsyncStub], Awaitable[_T]],
        *,
        not_found: ServiceError | None = None,
    ) -> _T:
        """``call`` on each name server in turn, starting with the preferred one, until
        one answers. NOT_FOUND (when ``not_found`` is given) also moves on; when every name
        server said NOT_FOUND, ``not_found`` is raised."""
        problems: list[str] = []
        stubs = self._connect()
        count = len(stubs)
        said_not_found = 0
        for step in range(count):
            index = (self._preferred + step) % count
            try:
                answer = await call(stubs[index])
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if not_found is not None and code is grpc.StatusCode.NOT_FOUND:
                    said_not_found += 1
                    problems.append(f"{self.addresses[index]}: NOT_FOUND")
                    continue
                if code in _TRY_NEXT:
                    problems.append(f"{self.addresses[index]}: {rpc_problem(exc)}")
                    continue
                raise ServiceError(
                    code, f"name server {self.addresses[index]} refused {what}: {exc.details()}"
                ) from exc
            if index != self._preferred:
                log.info("using name server %s (%s)", self.addresses[index], "; ".join(problems))
                self._preferred = index
            return answer
        if not_found is not None and said_not_found:
            raise not_found
        raise ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            f"no name server reachable for {what} ({'; '.join(problems)}); "
            "check --namesrv and that the name servers run",
        )

    async def topic_route(self, topic: str) -> ns_pb.TopicRoute:
        request = ns_pb.GetTopicRouteRequest(topic=topic)

        async def call(stub: ns_grpc.NameServerAsyncStub) -> ns_pb.TopicRoute:
            route: ns_pb.TopicRoute = await stub.GetTopicRoute(request, timeout=self._timeout_s)
            return route

        return await self._call(
            f"the route of topic {quote(topic)}", call, not_found=topic_not_found(topic)
        )

    async def cluster_info(self) -> ns_pb.ClusterInfo:
        async def call(stub: ns_grpc.NameServerAsyncStub) -> ns_pb.ClusterInfo:
            info: ns_pb.ClusterInfo = await stub.GetClusterInfo(
                ns_pb.GetClusterInfoRequest(), timeout=self._timeout_s
            )
            return info

        return await self._call("the cluster info", call)

    async def list_topics(self, include_hidden: bool = False) -> ns_pb.ListRouteTopicsResponse:
        request = ns_pb.ListRouteTopicsRequest(include_hidden=include_hidden)

        async def call(stub: ns_grpc.NameServerAsyncStub) -> ns_pb.ListRouteTopicsResponse:
            topics: ns_pb.ListRouteTopicsResponse = await stub.ListRouteTopics(
                request, timeout=self._timeout_s
            )
            return topics

        return await self._call("the topic list", call)

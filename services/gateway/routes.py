"""Topic routes and cluster info from the name servers, cached.

:class:`TopicView` is one topic's route in the shapes the gateway needs (writable queues,
a broker's addresses). :class:`RouteCache` keeps a view per topic: a miss fetches it (one
fetch however many calls wait for it), every cached topic is fetched again on the refresh
interval, and callers can ask for a fresh one (``refresh=True``) when the cached one does
not fit (an unknown broker, a stale queue count). Cluster info is cached the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import grpc

from services.gateway.namesrv import NameServerClient
from tide.format import TopicMessageType
from tide.server import ServiceError
from tide.single_flight import SingleFlight
from tide.v1 import nameserver_pb2 as ns_pb

log = logging.getLogger("tide.gateway.routes")

PERM_READ = 4
PERM_WRITE = 2
MASTER_ID = 0


@dataclass(frozen=True, slots=True, order=True)
class QueueRef:
    broker_name: str
    queue_id: int


@dataclass(frozen=True, slots=True)
class Member:
    """One live broker member: its storage and dispatch addresses."""

    broker_name: str
    broker_id: int
    storage: str
    dispatch: str


class TopicView:
    """A topic's route: queue data and live members per broker name."""

    def __init__(self, route: ns_pb.TopicRoute) -> None:
        self.topic = route.topic
        self.route = route
        # The messages the topic takes (checked on produce: message_types.py).
        self.message_type = route_message_type(route.message_type)
        self.queue_data: dict[str, ns_pb.QueueData] = {
            data.broker_name: data for data in route.queue_datas
        }
        self.members: dict[str, dict[int, Member]] = {}
        self.cluster_of: dict[str, str] = {}
        for broker in route.broker_datas:
            self.cluster_of[broker.broker_name] = broker.cluster_name
            self.members[broker.broker_name] = {
                broker_id: Member(broker.broker_name, broker_id, address.storage, address.dispatch)
                for broker_id, address in broker.addresses.items()
            }
        writable: list[QueueRef] = []
        for name in sorted(self.queue_data):
            data = self.queue_data[name]
            if data.perm & PERM_WRITE and self.master(name) is not None:
                writable.extend(QueueRef(name, qid) for qid in range(data.write_queue_nums))
        # Sorted by broker name, then queue id: the order sharding keys hash over.
        self.writable: tuple[QueueRef, ...] = tuple(writable)

    def master(self, broker_name: str) -> Member | None:
        return self.members.get(broker_name, {}).get(MASTER_ID)

    def reader(self, broker_name: str) -> Member | None:
        """The member to read from: the master, else the slave with the lowest id."""
        members = self.members.get(broker_name)
        if not members:
            return None
        return members.get(MASTER_ID) or members[min(members)]

    def masters(self) -> list[Member]:
        """The live master of every broker serving the topic."""
        found = (self.master(name) for name in sorted(self.queue_data))
        return [member for member in found if member is not None]

    def all_members(self) -> list[Member]:
        return [
            member
            for name in sorted(self.members)
            for _, member in sorted(self.members[name].items())
        ]


def route_message_type(value: str) -> TopicMessageType:
    """A route's type: NORMAL when unset (a name server from before message types);
    MIXED (nothing refused) for a value this gateway does not know."""
    if not value:
        return TopicMessageType.NORMAL
    return TopicMessageType.__members__.get(value, TopicMessageType.MIXED)


def masters_of(info: ns_pb.ClusterInfo, clusters: Iterable[str] | None = None) -> list[Member]:
    """Live master members from cluster info, of ``clusters`` only when given."""
    wanted = None if clusters is None else set(clusters)
    found: dict[str, Member] = {}
    for live in info.brokers:
        if live.broker_id != MASTER_ID or (wanted is not None and live.cluster_name not in wanted):
            continue
        found[live.broker_name] = Member(
            live.broker_name, live.broker_id, live.address.storage, live.address.dispatch
        )
    return [found[name] for name in sorted(found)]


@dataclass(slots=True)
class _Cached:
    view: TopicView
    fetched_s: float


class RouteCache:
    def __init__(
        self, namesrv: NameServerClient, refresh_interval_s: float, max_topics: int
    ) -> None:
        self.namesrv = namesrv
        self._refresh_interval_s = refresh_interval_s
        self._max_topics = max_topics
        self._views: OrderedDict[str, _Cached] = OrderedDict()
        self._fetching: SingleFlight[str, TopicView] = SingleFlight("route")
        self._cluster: ns_pb.ClusterInfo | None = None
        self._cluster_fetched_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._refresh_loop(), name="route-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def invalidate(self, topic: str) -> None:
        self._views.pop(topic, None)

    async def get(self, topic: str, *, refresh: bool = False) -> TopicView:
        """The topic's route; NOT_FOUND when no live broker serves it, UNAVAILABLE when no
        name server answers."""
        cached = self._views.get(topic)
        if cached is not None and not refresh:
            self._views.move_to_end(topic)
            return cached.view
        return await self._fetch(topic)

    async def _fetch(self, topic: str) -> TopicView:
        """One fetch per topic at a time (tide.single_flight: a caller that goes away,
        a cancelled call, does not cancel it for the others)."""
        return await self._fetching.run(topic, lambda: self._fetch_now(topic))

    async def _fetch_now(self, topic: str) -> TopicView:
        try:
            view = TopicView(await self.namesrv.topic_route(topic))
        except ServiceError as exc:
            if exc.code is grpc.StatusCode.NOT_FOUND:
                self._views.pop(topic, None)
            raise
        self._store(topic, view)
        return view

    def _store(self, topic: str, view: TopicView) -> None:
        self._views[topic] = _Cached(view, time.monotonic())
        self._views.move_to_end(topic)
        while len(self._views) > self._max_topics:
            self._views.popitem(last=False)

    async def cluster_info(self, *, refresh: bool = False) -> ns_pb.ClusterInfo:
        age_s = time.monotonic() - self._cluster_fetched_s
        if self._cluster is None or refresh or age_s >= self._refresh_interval_s:
            self._cluster = await self.namesrv.cluster_info()
            self._cluster_fetched_s = time.monotonic()
        return self._cluster

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval_s)
            deadline = time.monotonic() - self._refresh_interval_s / 2
            for topic in list(self._views):
                cached = self._views.get(topic)
                if cached is None or cached.fetched_s > deadline:
                    continue  # fetched recently (a miss or a refresh=True call)
                try:
                    view = TopicView(await self.namesrv.topic_route(topic))
                except ServiceError as exc:
                    if exc.code is grpc.StatusCode.NOT_FOUND:
                        log.info("topic %s is gone from the name servers", topic)
                        self._views.pop(topic, None)
                        continue
                    log.warning("route refresh failed, keeping the cached routes: %s", exc)
                    break
                if topic in self._views:
                    self._views[topic] = _Cached(view, time.monotonic())

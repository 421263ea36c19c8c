"""The name server's tables (RocketMQ's RouteInfoManager), in memory only.

* topics:   topic -> {broker name -> QueueData}
* brokers:  broker name -> BrokerData (cluster, {broker id -> BrokerAddress}; id 0 = master)
* clusters: cluster name -> {broker names}
* live:     storage address -> BrokerLive (last registration, timeout, data version)

Rules:

* A registration carries the broker's whole topic table. From the master (id 0) it
  REPLACES the queue data that broker name had: topics it no longer lists lose that
  broker's queue data, and a topic with no queue data left disappears. Registrations of
  slaves (id > 0) never touch queue data.
* Unregistering (or expiring) removes one member; when a broker name has no member left
  its queue data and its cluster entry go too.
* The same storage address moving to another broker id (a slave promoted to master)
  leaves its old id.

Every method takes the readers-writer lock, so the RPC handlers (loop thread) and the
expiry scan (its own thread) may call them concurrently.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tide.quoting import quote
from tide.rwlock import RWLock

_log = logging.getLogger("tide.nameserver.routes")

DEFAULT_BROKER_EXPIRY_MS = 120_000
DEFAULT_MAX_BROKERS = 10_000
DEFAULT_MAX_TOPICS_PER_REGISTRATION = 100_000
MASTER_ID = 0

DataVersion = tuple[int, int]
"""(timestamp_ms, counter), RocketMQ's DataVersion."""


class RouteLimitError(Exception):
    """A registration over a configured limit (RESOURCE_EXHAUSTED)."""


class RouteConflictError(Exception):
    """A registration that contradicts the tables (FAILED_PRECONDITION)."""


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    storage: str
    dispatch: str = ""


@dataclass(frozen=True, slots=True)
class QueueData:
    """One broker's queues of a topic; ``order`` is the topic config's order flag."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0
    order: bool = False
    message_type: str = "NORMAL"  # the topic's "message.type" attribute on this broker


@dataclass(frozen=True, slots=True)
class Registration:
    cluster_name: str
    broker_name: str
    broker_id: int
    address: BrokerAddress
    # topic -> its queue data on this broker (broker_name is the registration's)
    topics: Mapping[str, QueueData]
    data_version: DataVersion = (0, 0)
    # 0: the name server's default
    heartbeat_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class BrokerData:
    cluster_name: str
    broker_name: str
    addresses: Mapping[int, BrokerAddress]


@dataclass(frozen=True, slots=True)
class BrokerLive:
    cluster_name: str
    broker_name: str
    broker_id: int
    address: BrokerAddress
    last_update_ms: int
    heartbeat_timeout_ms: int
    data_version: DataVersion
    topic_count: int

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.last_update_ms > self.heartbeat_timeout_ms


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    queue_datas: list[QueueData]  # sorted by broker name
    broker_datas: list[BrokerData]  # sorted by broker name
    order: bool


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    clusters: dict[str, list[str]]  # cluster -> sorted broker names
    brokers: list[BrokerLive]  # sorted by (cluster, broker name, broker id)


@dataclass(slots=True)
class _Broker:
    cluster_name: str
    addresses: dict[int, BrokerAddress] = field(default_factory=dict)
    topics: set[str] = field(default_factory=set)  # topics holding this name's queue data


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class RouteInfo:
    def __init__(
        self,
        *,
        broker_expiry_ms: int = DEFAULT_BROKER_EXPIRY_MS,
        max_brokers: int = DEFAULT_MAX_BROKERS,
        max_topics_per_registration: int = DEFAULT_MAX_TOPICS_PER_REGISTRATION,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.broker_expiry_ms = broker_expiry_ms
        self.max_brokers = max_brokers
        self.max_topics_per_registration = max_topics_per_registration
        self._clock_ms = clock_ms
        self._lock = RWLock()
        self._topics: dict[str, dict[str, QueueData]] = {}
        self._brokers: dict[str, _Broker] = {}
        self._clusters: dict[str, set[str]] = {}
        self._live: dict[str, BrokerLive] = {}

    # -- writes ----------------------------------------------------------------------
    def register(self, reg: Registration) -> str:
        """Add or refresh one broker member; returns the master's storage address of its
        broker name ("" when no master is registered)."""
        if len(reg.topics) > self.max_topics_per_registration:
            raise RouteLimitError(
                f"the registration lists {len(reg.topics)} topics; this name server takes at "
                f"most {self.max_topics_per_registration} (--max-topics-per-registration)"
            )
        address = reg.address.storage
        with self._lock.write():
            live = self._live.get(address)
            self._check_room(reg, live)
            if live is not None and (live.broker_name, live.broker_id) != (
                reg.broker_name,
                reg.broker_id,
            ):
                _log.warning(
                    "%s was %s id %d and now registers as %s id %d",
                    address,
                    live.broker_name,
                    live.broker_id,
                    reg.broker_name,
                    reg.broker_id,
                )
                self._remove_member(live)
            broker = self._join(reg)
            if reg.broker_id == MASTER_ID:
                self._replace_queue_data(reg.broker_name, broker, reg.topics)
            self._live[address] = BrokerLive(
                cluster_name=reg.cluster_name,
                broker_name=reg.broker_name,
                broker_id=reg.broker_id,
                address=reg.address,
                last_update_ms=self._clock_ms(),
                heartbeat_timeout_ms=reg.heartbeat_timeout_ms or self.broker_expiry_ms,
                data_version=reg.data_version,
                topic_count=len(reg.topics),
            )
            if live is None:
                _log.info(
                    "registered %s/%s id %d at %s (%d topics)",
                    reg.cluster_name,
                    reg.broker_name,
                    reg.broker_id,
                    address,
                    len(reg.topics),
                )
            master = broker.addresses.get(MASTER_ID)
            return master.storage if master is not None else ""

    def unregister(
        self, cluster_name: str, broker_name: str, broker_id: int, storage_address: str
    ) -> bool:
        """Remove one member; False when no such member was registered."""
        with self._lock.write():
            live = self._live.get(storage_address)
            if live is None or (live.broker_name, live.broker_id) != (broker_name, broker_id):
                return False
            if live.cluster_name != cluster_name:
                return False
            self._remove_member(live)
        _log.info(
            "unregistered %s/%s id %d at %s", cluster_name, broker_name, broker_id, storage_address
        )
        return True

    def remove_expired(self) -> list[BrokerLive]:
        """Remove every member silent for longer than its heartbeat timeout."""
        now_ms = self._clock_ms()
        with self._lock.read():
            if not any(live.expired(now_ms) for live in self._live.values()):
                return []
        with self._lock.write():
            expired = [live for live in self._live.values() if live.expired(now_ms)]
            for live in expired:
                self._remove_member(live)
        return expired

    def _check_room(self, reg: Registration, live: BrokerLive | None) -> None:
        if live is None and len(self._live) >= self.max_brokers:
            raise RouteLimitError(
                f"this name server already holds the limit of {self.max_brokers} broker "
                f"members (--max-brokers); {reg.address.storage} was not registered"
            )
        broker = self._brokers.get(reg.broker_name)
        if broker is not None and broker.cluster_name != reg.cluster_name:
            raise RouteConflictError(
                f"broker name {quote(reg.broker_name)} is registered in cluster "
                f"{quote(broker.cluster_name)}, not {quote(reg.cluster_name)}: broker names "
                "are unique across clusters; rename the broker or stop the other one"
            )

    def _join(self, reg: Registration) -> _Broker:
        broker = self._brokers.get(reg.broker_name)
        if broker is None:
            broker = self._brokers[reg.broker_name] = _Broker(reg.cluster_name)
            self._clusters.setdefault(reg.cluster_name, set()).add(reg.broker_name)
        address = reg.address.storage
        for broker_id, other in list(broker.addresses.items()):
            if other.storage == address and broker_id != reg.broker_id:
                del broker.addresses[broker_id]  # e.g. a slave promoted to master
        previous = broker.addresses.get(reg.broker_id)
        if previous is not None and previous.storage != address:
            _log.warning(
                "%s id %d moves from %s to %s",
                reg.broker_name,
                reg.broker_id,
                previous.storage,
                address,
            )
            self._live.pop(previous.storage, None)
        broker.addresses[reg.broker_id] = reg.address
        return broker

    def _replace_queue_data(
        self, broker_name: str, broker: _Broker, topics: Mapping[str, QueueData]
    ) -> None:
        for topic in broker.topics - topics.keys():
            queues = self._topics[topic]
            del queues[broker_name]
            if not queues:
                del self._topics[topic]
        for topic, queue_data in topics.items():
            self._topics.setdefault(topic, {})[broker_name] = queue_data
        broker.topics = set(topics)

    def _remove_member(self, live: BrokerLive) -> None:
        self._live.pop(live.address.storage, None)
        broker = self._brokers.get(live.broker_name)
        if broker is None:
            return
        member = broker.addresses.get(live.broker_id)
        if member is not None and member.storage == live.address.storage:
            del broker.addresses[live.broker_id]
        if broker.addresses:
            return
        self._replace_queue_data(live.broker_name, broker, {})
        del self._brokers[live.broker_name]
        names = self._clusters.get(broker.cluster_name)
        if names is not None:
            names.discard(live.broker_name)
            if not names:
                del self._clusters[broker.cluster_name]

    # -- reads -----------------------------------------------------------------------
    def topic_route(self, topic: str) -> TopicRoute | None:
        """The topic's queue data and the brokers serving it; None for an unknown topic."""
        with self._lock.read():
            queues = self._topics.get(topic)
            if not queues:
                return None
            names = sorted(queues)
            queue_datas = [queues[name] for name in names]
            broker_datas = [self._broker_data(name) for name in names if name in self._brokers]
        return TopicRoute(
            topic=topic,
            queue_datas=queue_datas,
            broker_datas=broker_datas,
            order=any(queue_data.order for queue_data in queue_datas),
        )

    def cluster_info(self) -> ClusterInfo:
        with self._lock.read():
            clusters = {name: sorted(brokers) for name, brokers in self._clusters.items()}
            brokers = sorted(
                self._live.values(),
                key=lambda live: (live.cluster_name, live.broker_name, live.broker_id),
            )
        return ClusterInfo(clusters=clusters, brokers=brokers)

    def topics(self) -> list[str]:
        with self._lock.read():
            return sorted(self._topics)

    def topic_types(self) -> list[tuple[str, set[str]]]:
        """Every topic, sorted, with its brokers' message types."""
        with self._lock.read():
            return [
                (topic, {q.message_type for q in self._topics[topic].values()})
                for topic in sorted(self._topics)
            ]

    def broker_data(self, broker_name: str) -> BrokerData | None:
        with self._lock.read():
            if broker_name not in self._brokers:
                return None
            return self._broker_data(broker_name)

    def _broker_data(self, broker_name: str) -> BrokerData:
        broker = self._brokers[broker_name]
        return BrokerData(broker.cluster_name, broker_name, dict(broker.addresses))

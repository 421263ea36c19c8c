"""RouteInfo: the name server's tables and their RocketMQ rules (pure logic, fake clock)."""

from __future__ import annotations

import pytest

from services.nameserver.route_info import (
    BrokerAddress,
    QueueData,
    Registration,
    RouteConflictError,
    RouteInfo,
    RouteLimitError,
)


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def reg(
    broker_name: str = "broker-a",
    broker_id: int = 0,
    storage: str = "10.0.0.1:10911",
    topics: dict[str, int] | None = None,
    cluster: str = "DefaultCluster",
    timeout_ms: int = 0,
    order: bool = False,
) -> Registration:
    """A registration; ``topics`` maps topic -> queue count."""
    return Registration(
        cluster_name=cluster,
        broker_name=broker_name,
        broker_id=broker_id,
        address=BrokerAddress(storage, storage.replace("10911", "10921")),
        topics={
            name: QueueData(broker_name, nums, nums, 6, 0, order)
            for name, nums in (topics or {}).items()
        },
        data_version=(5, 7),
        heartbeat_timeout_ms=timeout_ms,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def routes(clock: FakeClock) -> RouteInfo:
    return RouteInfo(broker_expiry_ms=1000, clock_ms=clock)


def test_registration_makes_routes_and_cluster_info(routes: RouteInfo, clock: FakeClock) -> None:
    assert routes.register(reg(topics={"T1": 4, "T2": 2})) == "10.0.0.1:10911"
    routes.register(reg("broker-b", storage="10.0.0.2:10911", topics={"T1": 8}))
    route = routes.topic_route("T1")
    assert route is not None
    assert [(q.broker_name, q.write_queue_nums) for q in route.queue_datas] == [
        ("broker-a", 4),
        ("broker-b", 8),
    ]
    assert [b.broker_name for b in route.broker_datas] == ["broker-a", "broker-b"]
    assert route.broker_datas[1].addresses[0] == BrokerAddress("10.0.0.2:10911", "10.0.0.2:10921")
    t2 = routes.topic_route("T2")
    assert t2 is not None and [b.broker_name for b in t2.broker_datas] == ["broker-a"]
    assert routes.topic_route("T3") is None
    assert routes.topics() == ["T1", "T2"]
    info = routes.cluster_info()
    assert info.clusters == {"DefaultCluster": ["broker-a", "broker-b"]}
    first = info.brokers[0]
    assert (first.broker_name, first.last_update_ms, first.heartbeat_timeout_ms) == (
        "broker-a",
        clock.now_ms,
        1000,
    )
    assert (first.data_version, first.topic_count) == ((5, 7), 2)


def test_a_registration_replaces_what_the_broker_registered_before(routes: RouteInfo) -> None:
    routes.register(reg(topics={"T1": 4, "T2": 4, "Shared": 4}))
    routes.register(reg("broker-b", storage="10.0.0.2:10911", topics={"Shared": 2}))
    routes.register(reg(topics={"T2": 1, "T3": 3}))  # T1 and Shared are gone from broker-a
    assert routes.topic_route("T1") is None
    t2 = routes.topic_route("T2")
    assert t2 is not None and t2.queue_datas[0].write_queue_nums == 1
    shared = routes.topic_route("Shared")
    assert shared is not None and [q.broker_name for q in shared.queue_datas] == ["broker-b"]
    assert routes.topics() == ["Shared", "T2", "T3"]
    routes.register(reg(topics={}))
    assert routes.topics() == ["Shared"]
    assert routes.broker_data("broker-a") is not None  # still a member, with no topics


def test_only_the_master_registration_sets_queue_data(routes: RouteInfo) -> None:
    routes.register(reg(topics={"T1": 4}))
    master = routes.register(reg(broker_id=1, storage="10.0.0.9:10911", topics={"T1": 16, "X": 1}))
    assert master == "10.0.0.1:10911"
    route = routes.topic_route("T1")
    assert route is not None and route.queue_datas[0].write_queue_nums == 4
    assert routes.topic_route("X") is None
    assert set(route.broker_datas[0].addresses) == {0, 1}


def test_a_slave_without_a_master_gets_an_empty_master_address(routes: RouteInfo) -> None:
    assert routes.register(reg(broker_id=2, storage="10.0.0.9:10911", topics={"T": 1})) == ""
    assert routes.topics() == []


def test_unregister_removes_the_member_then_the_broker_name(routes: RouteInfo) -> None:
    routes.register(reg(topics={"T1": 4}))
    routes.register(reg(broker_id=1, storage="10.0.0.9:10911"))
    routes.register(reg("broker-b", storage="10.0.0.2:10911", topics={"T1": 2}))
    assert not routes.unregister("DefaultCluster", "broker-a", 0, "10.0.0.99:10911")
    assert not routes.unregister("OtherCluster", "broker-a", 0, "10.0.0.1:10911")
    assert routes.unregister("DefaultCluster", "broker-a", 0, "10.0.0.1:10911")
    route = routes.topic_route("T1")  # the slave keeps broker-a's queue data (RocketMQ)
    assert route is not None and [q.broker_name for q in route.queue_datas] == [
        "broker-a",
        "broker-b",
    ]
    assert routes.unregister("DefaultCluster", "broker-a", 1, "10.0.0.9:10911")
    route = routes.topic_route("T1")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["broker-b"]
    assert routes.broker_data("broker-a") is None
    assert routes.unregister("DefaultCluster", "broker-b", 0, "10.0.0.2:10911")
    assert routes.topics() == []
    info = routes.cluster_info()
    assert (info.clusters, info.brokers) == ({}, [])
    assert not routes.unregister("DefaultCluster", "broker-b", 0, "10.0.0.2:10911")


def test_silent_brokers_expire_after_their_timeout(routes: RouteInfo, clock: FakeClock) -> None:
    routes.register(reg(topics={"T1": 4}))  # the default timeout: 1000 ms
    routes.register(reg("broker-b", storage="10.0.0.2:10911", topics={"T1": 4}, timeout_ms=5000))
    clock.now_ms += 1000
    assert routes.remove_expired() == []  # exactly the timeout: still live
    clock.now_ms += 1
    expired = routes.remove_expired()
    assert [live.broker_name for live in expired] == ["broker-a"]
    route = routes.topic_route("T1")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["broker-b"]
    assert routes.cluster_info().clusters == {"DefaultCluster": ["broker-b"]}
    clock.now_ms += 3000
    routes.register(reg("broker-b", storage="10.0.0.2:10911", topics={"T1": 4}, timeout_ms=5000))
    clock.now_ms += 4000
    assert routes.remove_expired() == []  # refreshed by the registration
    clock.now_ms += 1001
    assert [live.broker_name for live in routes.remove_expired()] == ["broker-b"]
    assert routes.topics() == []


def test_a_promoted_slave_leaves_its_old_id(routes: RouteInfo) -> None:
    routes.register(reg(topics={"T1": 4}))
    routes.register(reg(broker_id=1, storage="10.0.0.9:10911"))
    routes.unregister("DefaultCluster", "broker-a", 0, "10.0.0.1:10911")
    routes.register(reg(broker_id=0, storage="10.0.0.9:10911", topics={"T1": 4}))
    data = routes.broker_data("broker-a")
    assert data is not None and dict(data.addresses) == {
        0: BrokerAddress("10.0.0.9:10911", "10.0.0.9:10921")
    }
    assert len(routes.cluster_info().brokers) == 1


def test_a_master_moving_to_another_address_replaces_the_old_one(routes: RouteInfo) -> None:
    routes.register(reg(topics={"T1": 4}))
    routes.register(reg(storage="10.0.0.5:10911", topics={"T1": 4}))
    data = routes.broker_data("broker-a")
    assert data is not None and data.addresses[0].storage == "10.0.0.5:10911"
    assert [live.address.storage for live in routes.cluster_info().brokers] == ["10.0.0.5:10911"]


def test_a_broker_name_belongs_to_one_cluster(routes: RouteInfo) -> None:
    routes.register(reg(topics={"T1": 4}))
    with pytest.raises(RouteConflictError, match="registered in cluster 'DefaultCluster'"):
        routes.register(reg(storage="10.0.0.7:10911", cluster="Other"))
    assert routes.cluster_info().clusters == {"DefaultCluster": ["broker-a"]}


def test_limits(clock: FakeClock) -> None:
    routes = RouteInfo(max_brokers=2, max_topics_per_registration=2, clock_ms=clock)
    routes.register(reg(topics={"A": 1, "B": 1}))
    with pytest.raises(RouteLimitError, match="at most 2"):
        routes.register(reg(topics={"A": 1, "B": 1, "C": 1}))
    routes.register(reg("broker-b", storage="10.0.0.2:10911"))
    with pytest.raises(RouteLimitError, match="limit of 2 broker members"):
        routes.register(reg("broker-c", storage="10.0.0.3:10911"))
    routes.register(reg("broker-b", storage="10.0.0.2:10911"))  # a refresh still works
    assert routes.topics() == ["A", "B"]


def test_route_order_comes_from_the_topic_config(routes: RouteInfo) -> None:
    routes.register(reg(topics={"O": 1}, order=True))
    route = routes.topic_route("O")
    assert route is not None and route.order

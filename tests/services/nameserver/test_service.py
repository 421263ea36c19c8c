"""tide.v1.NameServer as a real process over real gRPC: registration, routes, expiry,
independent replicas, health, reflection and bad input."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.services.nameserver.process import (
    REPO,
    RPC_TIMEOUT_S,
    NameServerLauncher,
    NameServerProcess,
)
from tests.services.storage.conftest import expect_error
from tide.v1 import nameserver_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def register_request(
    broker_name: str,
    storage: str,
    topics: dict[str, int],
    *,
    broker_id: int = 0,
    cluster: str = "DefaultCluster",
    timeout_ms: int = 0,
) -> pb.RegisterBrokerRequest:
    return pb.RegisterBrokerRequest(
        cluster_name=cluster,
        broker_name=broker_name,
        broker_id=broker_id,
        address=pb.BrokerAddress(storage=storage, dispatch=storage.replace(":10911", ":10921")),
        topics=[
            storage_pb.TopicConfig(
                topic_name=name, read_queue_nums=nums, write_queue_nums=nums, perm=6
            )
            for name, nums in topics.items()
        ],
        data_version=pb.DataVersion(timestamp_ms=1, counter=3),
        heartbeat_timeout_ms=timeout_ms,
    )


def register(ns: NameServerProcess, request: pb.RegisterBrokerRequest) -> str:
    return ns.stub.RegisterBroker(request, timeout=RPC_TIMEOUT_S).master_address


def unregister(ns: NameServerProcess, broker_name: str, storage: str, broker_id: int = 0) -> bool:
    request = pb.UnregisterBrokerRequest(
        cluster_name="DefaultCluster",
        broker_name=broker_name,
        broker_id=broker_id,
        storage_address=storage,
    )
    return ns.stub.UnregisterBroker(request, timeout=RPC_TIMEOUT_S).existed


def test_registration_makes_a_route(shared_nameserver: NameServerProcess) -> None:
    ns = shared_nameserver
    assert register(ns, register_request("route-a", "10.0.1.1:10911", {"RouteT": 4})) == (
        "10.0.1.1:10911"
    )
    register(ns, register_request("route-b", "10.0.1.2:10911", {"RouteT": 2}))
    route = ns.route("RouteT")
    assert route.topic == "RouteT"
    assert [(q.broker_name, q.read_queue_nums, q.perm) for q in route.queue_datas] == [
        ("route-a", 4, 6),
        ("route-b", 2, 6),
    ]
    addresses = {b.broker_name: b.addresses[0] for b in route.broker_datas}
    assert addresses["route-a"].storage == "10.0.1.1:10911"
    assert addresses["route-a"].dispatch == "10.0.1.1:10921"
    assert "RouteT" in ns.topics()
    info = ns.cluster_info()
    assert {"route-a", "route-b"} <= set(info.clusters["DefaultCluster"].broker_names)
    live = next(b for b in info.brokers if b.broker_name == "route-a")
    assert (live.topic_count, live.data_version.counter, live.heartbeat_timeout_ms) == (
        1,
        3,
        120_000,
    )
    assert live.last_update_ms > 0


def test_a_registration_replaces_the_brokers_topics(shared_nameserver: NameServerProcess) -> None:
    ns = shared_nameserver
    register(ns, register_request("repl-a", "10.0.2.1:10911", {"ReplOld": 4, "ReplKept": 4}))
    register(ns, register_request("repl-a", "10.0.2.1:10911", {"ReplKept": 8, "ReplNew": 1}))
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: ns.route("ReplOld"), "ReplOld")
    assert ns.route("ReplKept").queue_datas[0].write_queue_nums == 8
    assert ns.route("ReplNew").queue_datas[0].broker_name == "repl-a"


def test_a_slave_registration_does_not_set_queue_data(shared_nameserver: NameServerProcess) -> None:
    ns = shared_nameserver
    register(ns, register_request("slave-a", "10.0.3.1:10911", {"SlaveT": 4}))
    master = register(
        ns, register_request("slave-a", "10.0.3.2:10911", {"SlaveT": 9, "SlaveX": 1}, broker_id=1)
    )
    assert master == "10.0.3.1:10911"
    route = ns.route("SlaveT")
    assert route.queue_datas[0].write_queue_nums == 4
    assert set(route.broker_datas[0].addresses) == {0, 1}
    assert "SlaveX" not in ns.topics()


def test_message_types_and_hidden_topics(shared_nameserver: NameServerProcess) -> None:
    ns = shared_nameserver
    fifo = register_request("type-a", "10.0.4.1:10911", {"TypeT": 1, "%RETRY%g": 1, "Plain": 1})
    fifo.topics[0].attributes["message.type"] = "FIFO"
    register(ns, fifo)
    delay = register_request("type-b", "10.0.4.2:10911", {"TypeT": 1, "rmq_sys_wheel_timer": 1})
    delay.topics[0].attributes["message.type"] = "DELAY"
    register(ns, delay)
    route = ns.route("TypeT")
    assert [(q.broker_name, q.message_type) for q in route.queue_datas] == [
        ("type-a", "FIFO"),
        ("type-b", "DELAY"),
    ]
    assert route.message_type == "MIXED"
    assert ns.route("Plain").message_type == "NORMAL"
    shown = ns.stub.ListRouteTopics(pb.ListRouteTopicsRequest(), timeout=RPC_TIMEOUT_S)
    types = dict(zip(shown.topics, shown.message_types, strict=True))
    assert (types["TypeT"], types["Plain"]) == ("MIXED", "NORMAL")
    assert "%RETRY%g" not in types and "rmq_sys_wheel_timer" not in types
    every = ns.stub.ListRouteTopics(
        pb.ListRouteTopicsRequest(include_hidden=True), timeout=RPC_TIMEOUT_S
    )
    assert {"%RETRY%g", "rmq_sys_wheel_timer", "TypeT"} <= set(every.topics)
    assert list(every.topics) == sorted(every.topics)


def test_an_unknown_topic_has_no_route(shared_nameserver: NameServerProcess) -> None:
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: shared_nameserver.route("NoSuchTopic"),
        "topic NoSuchTopic has no route: no live broker serves it",
        "tide topic create NoSuchTopic",
    )


def test_unregister_removes_the_broker_and_its_routes(
    shared_nameserver: NameServerProcess,
) -> None:
    ns = shared_nameserver
    register(ns, register_request("unreg-a", "10.0.4.1:10911", {"UnregT": 4}))
    assert not unregister(ns, "unreg-a", "10.0.4.9:10911")  # not the registered address
    assert unregister(ns, "unreg-a", "10.0.4.1:10911")
    assert not unregister(ns, "unreg-a", "10.0.4.1:10911")
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: ns.route("UnregT"))
    assert "unreg-a" not in ns.cluster_info().clusters["DefaultCluster"].broker_names


def test_a_broker_name_is_unique_across_clusters(shared_nameserver: NameServerProcess) -> None:
    ns = shared_nameserver
    register(ns, register_request("uniq-a", "10.0.5.1:10911", {}))
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: register(ns, register_request("uniq-a", "10.0.5.2:10911", {}, cluster="Other")),
        "broker name 'uniq-a' is registered in cluster 'DefaultCluster'",
    )


def test_silent_brokers_expire(nameservers: NameServerLauncher) -> None:
    ns = nameservers.start("--broker-expiry-ms", "300", "--scan-interval-ms", "50")
    register(ns, register_request("exp-a", "10.0.6.1:10911", {"ExpT": 1}))
    register(ns, register_request("exp-b", "10.0.6.2:10911", {"ExpT": 1}, timeout_ms=60_000))
    wait_until(
        lambda: [q.broker_name for q in ns.route("ExpT").queue_datas] == ["exp-b"],
        "exp-a to expire",
        timeout_s=10,
    )
    assert [m[0] for m in ns.members()] == ["exp-b"]  # its own timeout keeps exp-b
    assert "broker DefaultCluster/exp-a id 0 at 10.0.6.1:10911 expired" in ns.stderr()
    ns.stop()


def test_name_servers_are_independent(nameservers: NameServerLauncher) -> None:
    first, second = nameservers.start(), nameservers.start()
    register(first, register_request("indep-a", "10.0.7.1:10911", {"IndepT": 2}))
    assert first.topics() == ["IndepT"]
    assert second.topics() == []
    assert second.cluster_info().brokers == []
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: second.route("IndepT"))
    first.stop()
    assert second.cluster_info().clusters == {}  # still serving after the other stopped
    second.stop()


def test_limits_are_enforced(nameservers: NameServerLauncher) -> None:
    ns = nameservers.start("--max-brokers", "1", "--max-topics-per-registration", "2")
    expect_error(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        lambda: register(ns, register_request("lim-a", "10.0.8.1:10911", {"A": 1, "B": 1, "C": 1})),
        "at most 2 (--max-topics-per-registration)",
    )
    register(ns, register_request("lim-a", "10.0.8.1:10911", {"A": 1, "B": 1}))
    expect_error(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        lambda: register(ns, register_request("lim-b", "10.0.8.2:10911", {})),
        "limit of 1 broker members (--max-brokers)",
    )
    ns.stop()


def _bad(**changes: object) -> pb.RegisterBrokerRequest:
    request = register_request("bad-a", "10.0.9.1:10911", {"BadT": 1})
    for name, value in changes.items():
        if name == "storage":
            request.address.storage = str(value)
        elif name == "dispatch":
            request.address.dispatch = str(value)
        elif name == "topic":
            request.topics[0].topic_name = str(value)
        elif name == "twice":
            request.topics.append(request.topics[0])
        elif name == "message_type":
            request.topics[0].attributes["message.type"] = str(value)
        else:
            setattr(request, name, value)
    return request


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (_bad(cluster_name=""), "cluster_name is empty"),
        (_bad(broker_name="a/b"), "broker_name 'a/b' contains '/'"),
        (_bad(broker_id=-1), "broker_id is -1"),
        (_bad(storage=""), "address.storage is empty"),
        (_bad(storage="10.0.0.1"), "address.storage must be HOST:PORT"),
        (_bad(storage="10.0.0.1:0"), "port in 1..65535"),
        (_bad(dispatch="nohost:x"), "address.dispatch must be HOST:PORT"),
        (_bad(topic="bad topic"), "topics[0]: topic 'bad topic' contains ' '"),
        (_bad(twice=True), "topics[1]: topic 'BadT' is listed twice"),
        (_bad(heartbeat_timeout_ms=-5), "heartbeat_timeout_ms is -5"),
        (_bad(message_type="LIFO"), "topics[0] (BadT): attributes: message.type is 'LIFO'"),
    ],
)
def test_bad_registrations_name_the_field(
    shared_nameserver: NameServerProcess, request_: pb.RegisterBrokerRequest, fragment: str
) -> None:
    expect_error(INVALID, lambda: register(shared_nameserver, request_), fragment)
    assert "bad-a" not in str(shared_nameserver.cluster_info())


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda ns: ns.route(""), "topic is empty"),
        (lambda ns: ns.route("a.b"), "contains '.'"),
        (lambda ns: unregister(ns, "", "10.0.0.1:1"), "broker_name is empty"),
        (lambda ns: unregister(ns, "x", "nope"), "storage must be HOST:PORT"),
    ],
)
def test_bad_queries_name_the_field(
    shared_nameserver: NameServerProcess,
    call: Callable[[NameServerProcess], object],
    fragment: str,
) -> None:
    expect_error(INVALID, lambda: call(shared_nameserver), fragment)


def test_health_and_reflection(shared_nameserver: NameServerProcess) -> None:
    health = health_pb2_grpc.HealthStub(shared_nameserver.channel)
    for service in ("", "tide.v1.NameServer"):
        response = health.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S
        )
        assert response.status == health_pb2.HealthCheckResponse.SERVING, service
    reflection = reflection_pb2_grpc.ServerReflectionStub(shared_nameserver.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    responses = list(reflection.ServerReflectionInfo(iter([request]), timeout=RPC_TIMEOUT_S))
    names = {s.name for s in responses[0].list_services_response.service}
    assert {"tide.v1.NameServer", "grpc.health.v1.Health"} <= names


def test_default_port_and_bad_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.nameserver", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "default: 127.0.0.1:9876" in text
    assert "--broker-expiry-ms INT" in text and "[unit: ms]" in text
    bad = subprocess.run(
        [sys.executable, "-m", "services.nameserver", "--scan-interval-ms", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert "--scan-interval-ms: 0 is outside 1..3600000" in bad.stderr

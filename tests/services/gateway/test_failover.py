"""Brokers and name servers going away under a gateway: produce moves to the brokers that
are left, a dead broker drops out of the route, the other name server answers, and with
nothing left the calls fail UNAVAILABLE."""

from __future__ import annotations

from collections import Counter
from functools import partial

import grpc

from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tests.services.nameserver.process import NameServerProcess
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.v1 import nameserver_pb2 as ns_pb
from tide.waiting import wait_until

failover_cluster = cluster_fixture(
    name="failover_cluster", brokers=2, nameservers=2, scope="function"
)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def produce(stub: pb_grpc.GatewayStub, *messages: pb.ProduceMessage) -> list[pb.ProduceResult]:
    reply = stub.Produce(pb.ProduceRequest(messages=list(messages)), timeout=RPC_TIMEOUT_S)
    return list(reply.results)


def route_brokers(stub: pb_grpc.GatewayStub, topic: str) -> set[str]:
    route = stub.GetTopicRoute(ns_pb.GetTopicRouteRequest(topic=topic), timeout=RPC_TIMEOUT_S)
    return {data.broker_name for data in route.queue_datas}


def served_by_only(nameserver: NameServerProcess, topic: str, broker: str) -> bool:
    return {data.broker_name for data in nameserver.route(topic).queue_datas} == {broker}


def test_dead_broker_is_retried_around_then_drops_out_of_the_route(
    failover_cluster: Cluster,
) -> None:
    cluster = failover_cluster
    topic = "T_failover"
    cluster.create_topic(topic, queues=2)
    stub = cluster.gateway.stub
    # One request each: successive requests rotate over the queues of both brokers.
    before = [r for _ in range(8) for r in produce(stub, pb.ProduceMessage(topic=topic, body=b"x"))]
    assert {r.broker_name for r in before} == {"broker-a", "broker-b"}

    cluster.broker("broker-b").kill()
    to_b = pb.ProduceMessage(topic=topic, body=b"b", queue=pb.QueueRef(broker_name="broker-b"))
    expect_error(UNAVAILABLE, lambda: produce(stub, to_b), "broker-b", "is the broker up?")
    # Round robin: a batch that would have gone to broker-b is retried on broker-a.
    moved = [
        r for _ in range(4) for r in produce(stub, *[pb.ProduceMessage(topic=topic, body=b"y")] * 5)
    ]
    assert all(r.status == pb.ProduceResult.SEND_OK for r in moved)
    assert Counter(r.broker_name for r in moved) == {"broker-a": 20}
    # An explicit queue is never retried elsewhere: partial success.
    mixed = produce(stub, pb.ProduceMessage(topic=topic, body=b"a"), to_b)
    assert mixed[0].status == pb.ProduceResult.SEND_OK and mixed[0].broker_name == "broker-a"
    assert mixed[1].status == pb.ProduceResult.SEND_FAILED
    assert "UNAVAILABLE" in mixed[1].error and "broker-b" in mixed[1].error
    expect_error(
        UNAVAILABLE,
        lambda: stub.Pull(
            pb.PullRequest(topic=topic, broker_name="broker-b", queue_id=0), timeout=RPC_TIMEOUT_S
        ),
        "broker-b",
    )

    for nameserver in cluster.nameservers:  # each expires the broker on its own clock
        wait_until(
            partial(served_by_only, nameserver, topic, "broker-a"),
            f"broker-b to expire from name server {nameserver.listen}",
        )
    assert route_brokers(stub, topic) == {"broker-a"}
    after = produce(stub, *(pb.ProduceMessage(topic=topic, body=b"z") for _ in range(8)))
    assert Counter(r.broker_name for r in after) == {"broker-a": 8}
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: produce(stub, to_b), "broker-b")

    # One name server gone: the other answers.
    cluster.nameservers[0].kill()
    assert route_brokers(stub, topic) == {"broker-a"}
    assert topic in stub.ListTopics(ns_pb.ListRouteTopicsRequest(), timeout=RPC_TIMEOUT_S).topics

    # No broker left.
    cluster.broker("broker-a").kill()
    expect_error(
        UNAVAILABLE,
        lambda: produce(stub, pb.ProduceMessage(topic=topic, body=b"none")),
        "broker-a",
    )
    # No name server left.
    cluster.nameservers[1].kill()
    expect_error(
        UNAVAILABLE,
        lambda: stub.ListTopics(ns_pb.ListRouteTopicsRequest(), timeout=RPC_TIMEOUT_S),
        "no name server reachable",
        "--namesrv",
    )

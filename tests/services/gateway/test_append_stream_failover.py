"""Produce over the gateway's AppendStream streams in a real cluster: a few streams carry
every produce, a killed storage is failed over and reported UNAVAILABLE within the broker
timeout (no hang), and produce to it works again once it is restarted."""

from __future__ import annotations

import time
from collections import Counter

import grpc

from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tests.services.storage.conftest import StorageProcess
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until

BROKER_TIMEOUT_MS = 2_000
stream_cluster = cluster_fixture(
    name="stream_cluster",
    brokers=2,
    scope="function",
    gateway_args=("--broker-timeout-ms", str(BROKER_TIMEOUT_MS)),
)


def produce(cluster: Cluster, *messages: pb.ProduceMessage) -> list[pb.ProduceResult]:
    reply = cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=list(messages)), timeout=RPC_TIMEOUT_S
    )
    return list(reply.results)


def streams_logged(storage: StorageProcess) -> int:
    return sum(
        "append stream from" in line and line.endswith(" opened")
        for line in storage.stderr().splitlines()
    )


def test_produce_rides_few_streams_and_survives_a_storage_restart(
    stream_cluster: Cluster,
) -> None:
    cluster = stream_cluster
    topic = "T_streams"
    cluster.create_topic(topic, queues=2)
    for _ in range(30):
        results = produce(cluster, *(pb.ProduceMessage(topic=topic, body=b"x") for _ in range(4)))
        assert all(r.status == pb.ProduceResult.SEND_OK for r in results)
    for broker in cluster.brokers:
        assert 1 <= streams_logged(broker.storage) <= 2  # reused, not one per call

    to_a = pb.ProduceMessage(topic=topic, body=b"a", queue=pb.QueueRef(broker_name="broker-a"))
    broker_a = cluster.broker("broker-a")
    broker_a.master.kill()
    for _ in range(3):
        started = time.monotonic()
        expect_error(grpc.StatusCode.UNAVAILABLE, lambda: produce(cluster, to_a), "broker-a")
        assert time.monotonic() - started < BROKER_TIMEOUT_MS / 1000 + 2  # no hang
    moved = produce(cluster, *(pb.ProduceMessage(topic=topic, body=b"y") for _ in range(10)))
    assert Counter(r.broker_name for r in moved) == {"broker-b": 10}  # failed over

    cluster.restart(broker_a.master)

    def produced_to_a() -> bool:
        try:
            (result,) = produce(cluster, to_a)
        except grpc.RpcError as exc:
            assert isinstance(exc, grpc.Call) and exc.code() is grpc.StatusCode.UNAVAILABLE
            return False
        return result.status == pb.ProduceResult.SEND_OK and result.broker_name == "broker-a"

    wait_until(produced_to_a, "produce to the restarted broker-a")
    assert 1 <= streams_logged(broker_a.storage) <= 2

"""Telemetry streams: settings answered at once with status OK on an open stream (the
clients wait for it), the stream kept open, and ended cleanly when the gateway shuts
down (not cut at the end of the grace period); health lists the v2 service."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests._cluster import RPC_TIMEOUT_S, Cluster, cluster_fixture
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.rocketmq_v2 import service_pb2_grpc as v2_grpc

SERVICE = "apache.rocketmq.v2.MessagingService"
own = cluster_fixture(name="own", brokers=1, scope="function")


def _requests(commands: queue.Queue[v2s.TelemetryCommand | None]) -> Iterator[v2s.TelemetryCommand]:
    while (command := commands.get()) is not None:
        yield command


def test_settings_are_answered_on_an_open_stream_which_shutdown_ends(
    own: Cluster, topic_name: str
) -> None:
    commands: queue.Queue[v2s.TelemetryCommand | None] = queue.Queue()
    settings = v2.Settings(
        client_type=v2.PRODUCER,
        publishing=v2.Publishing(topics=[v2.Resource(name=topic_name)]),
    )
    commands.put(v2s.TelemetryCommand(settings=settings))
    answers: list[v2s.TelemetryCommand] = []
    first = threading.Event()
    outcome: list[object] = []

    def follow(stub: v2_grpc.MessagingServiceStub) -> None:
        try:
            for answer in stub.Telemetry(_requests(commands), timeout=120):
                answers.append(answer)
                first.set()
            outcome.append("ended")
        except grpc.RpcError as exc:
            outcome.append(exc)
        first.set()

    with grpc.insecure_channel(own.gateway.listen) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        served = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=RPC_TIMEOUT_S)
        assert served.status == health_pb2.HealthCheckResponse.SERVING
        reader = threading.Thread(target=follow, args=(v2_grpc.MessagingServiceStub(channel),))
        reader.start()
        try:
            assert first.wait(RPC_TIMEOUT_S), "no answer to the settings"
            assert answers and answers[0].status.code == v2.OK
            assert answers[0].settings.publishing.max_body_size > 0
            assert not outcome, f"the stream ended while the client kept it open: {outcome}"
            own.gateway.stop()  # SIGTERM: graceful shutdown with the stream open
            reader.join(RPC_TIMEOUT_S * 3)
        finally:
            commands.put(None)
            reader.join(RPC_TIMEOUT_S)
    assert outcome == ["ended"], outcome  # ended by the server, not cut by the grace period

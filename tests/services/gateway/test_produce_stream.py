"""ProduceStream through a real gateway in front of two real brokers: answers in request
order with many requests in flight, in-band errors, half-close, cancellation, shutdown."""

from __future__ import annotations

import queue
import re
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.waiting import wait_until

# A cluster of its own: one test stops its gateway.
cluster = cluster_fixture(brokers=2)

INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
STOP_WITHIN_S = 5.0


def request(topic: str, *bodies: str) -> pb.ProduceRequest:
    return pb.ProduceRequest(
        messages=[pb.ProduceMessage(topic=topic, body=b.encode()) for b in bodies]
    )


def stream(
    stub: pb_grpc.GatewayStub, requests: list[pb.ProduceRequest]
) -> list[pb.ProduceStreamResponse]:
    return list(stub.ProduceStream(iter(requests), timeout=RPC_TIMEOUT_S))


def open_stream(stub: pb_grpc.GatewayStub, feeder: Feeder, timeout_s: float = RPC_TIMEOUT_S) -> Any:
    """The call: an iterator of the answers and a grpc.Call (code, details, cancel)."""
    return stub.ProduceStream(iter(feeder), timeout=timeout_s)


class Feeder:
    """A request iterator fed by the test; ``close()`` half-closes the stream."""

    _END = object()

    def __init__(self) -> None:
        self._queue: queue.Queue[object] = queue.Queue()

    def send(self, item: pb.ProduceRequest) -> None:
        self._queue.put(item)

    def close(self) -> None:
        self._queue.put(self._END)

    def __iter__(self) -> Iterator[pb.ProduceRequest]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            assert isinstance(item, pb.ProduceRequest)
            yield item


def test_stream_answers_like_produce_in_request_order_with_many_in_flight(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=2)
    stub = cluster.gateway.stub
    requests = [request(topic_name, *(f"r{r}m{m}" for m in range(10))) for r in range(200)]
    answers = stream(stub, requests)
    assert len(answers) == 200
    offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
    for answer in answers:
        assert answer.error_code == 0 and answer.error_message == ""
        results = answer.response.results
        assert len(results) == 10
        for result in results:
            assert result.status == pb.ProduceResult.SEND_OK
            assert len(result.msg_id) == 32 and len(result.unique_key) == 32
            offsets[(result.broker_name, result.queue_id)].append(result.queue_offset)
        within: dict[tuple[str, int], list[int]] = defaultdict(list)
        for result in results:  # increasing per queue within one answer
            within[(result.broker_name, result.queue_id)].append(result.queue_offset)
        assert all(o == sorted(o) for o in within.values())
    # Every queue got its offsets exactly once (requests ran concurrently, so not in order).
    assert {queue for queue in offsets} == {
        (b, q) for b in ("broker-a", "broker-b") for q in (0, 1)
    }
    for queue_offsets in offsets.values():
        assert sorted(queue_offsets) == list(range(len(queue_offsets)))
    assert sum(len(o) for o in offsets.values()) == 2000
    # The same shape as a unary Produce's results.
    unary = stub.Produce(request(topic_name, "unary"), timeout=RPC_TIMEOUT_S)
    assert fields(answers[0].response.results[0]) == fields(unary.results[0])


def fields(result: pb.ProduceResult) -> set[str]:
    """The fields set (queue id and offset can be 0, the default: always counted)."""
    return {descriptor.name for descriptor, _ in result.ListFields()} | {"queue_id", "queue_offset"}


def test_answers_come_back_in_request_order(cluster: Cluster, topic_name: str) -> None:
    """Each request goes to one explicit queue: its answer names the queue it asked for."""
    cluster.create_topic(topic_name, queues=4)
    requests = []
    for index in range(128):
        message = pb.ProduceMessage(
            topic=topic_name,
            body=b"x",
            queue=pb.QueueRef(broker_name=("broker-a", "broker-b")[index % 2], queue_id=index % 4),
        )
        requests.append(pb.ProduceRequest(messages=[message] * (1 + index % 5)))
    answers = stream(cluster.gateway.stub, requests)
    assert len(answers) == len(requests)
    assert not any(answer.next for answer in answers)  # not asked for: one answer each
    for sent, answer in zip(requests, answers, strict=True):
        assert answer.error_code == 0, answer.error_message
        expected = (sent.messages[0].queue.broker_name, sent.messages[0].queue.queue_id)
        assert len(answer.response.results) == len(sent.messages)
        for result in answer.response.results:
            assert (result.broker_name, result.queue_id) == expected


def test_a_bad_request_is_answered_in_band_and_the_stream_goes_on(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=2)
    bad = pb.ProduceRequest(
        messages=[
            pb.ProduceMessage(topic=topic_name, body=b"ok"),
            pb.ProduceMessage(topic="bad topic!", body=b"x"),
        ]
    )
    requests = [
        request(topic_name, "a"),
        bad,
        request(topic_name, "b"),
        pb.ProduceRequest(),
        request("T_no_such_topic_for_produce_stream", "c"),
        request(topic_name, "d", "e"),
    ]
    answers = stream(cluster.gateway.stub, requests)
    assert [a.error_code for a in answers] == [0, INVALID, 0, INVALID, NOT_FOUND, 0]
    assert "messages[1]" in answers[1].error_message
    assert "messages" in answers[3].error_message
    assert "T_no_such_topic_for_produce_stream" in answers[4].error_message
    assert not answers[1].HasField("response")
    assert [len(a.response.results) for a in answers] == [1, 0, 1, 0, 0, 2]


def test_packed_answers_answer_every_request_once_in_order(
    cluster: Cluster, topic_name: str
) -> None:
    """Requests asking for pack_answers (as tide.client's do): the answers, taken out of
    each message and its ``next``, are exactly the unpacked answers' order and content;
    an in-band error rides along where it belongs."""
    cluster.create_topic(topic_name, queues=2)
    requests = []
    for index in range(300):
        if index % 50 == 7:
            sent = pb.ProduceRequest(messages=[pb.ProduceMessage(topic="bad topic!", body=b"x")])
        else:
            sent = request(topic_name, *(f"r{index}m{m}" for m in range(1 + index % 4)))
        sent.pack_answers = True
        requests.append(sent)
    messages = stream(cluster.gateway.stub, requests)
    answers = [answer for message in messages for answer in (message, *message.next)]
    assert len(answers) == len(requests)
    for index, (sent, answer) in enumerate(zip(requests, answers, strict=True)):
        if index % 50 == 7:
            assert answer.error_code == INVALID and "messages[0]" in answer.error_message
            continue
        assert answer.error_code == 0, answer.error_message
        assert len(answer.response.results) == len(sent.messages)
    assert all(not answer.next for message in messages for answer in message.next)
    assert len(messages) <= len(requests)


def test_half_close_answers_everything_then_ends(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=2)
    feeder = Feeder()
    call = open_stream(cluster.gateway.stub, feeder)
    for index in range(40):
        feeder.send(request(topic_name, f"m{index}"))
    first = next(call)  # the stream is open and answering before the client half-closes
    assert first.error_code == 0
    feeder.close()
    rest = list(call)
    assert len(rest) == 39 and all(a.error_code == 0 for a in rest)
    assert call.code() is grpc.StatusCode.OK


def test_client_cancel_leaves_the_gateway_healthy(cluster: Cluster, topic_name: str) -> None:
    """Cancelled streams end on the gateway (its open-stream gauge is back to 0), which
    stays healthy; stream requests count in the produce metrics."""
    gateway = cluster.restart_gateway("--metrics-listen", "127.0.0.1:0")
    metrics_url = f"http://{gateway.ready['metrics']}/metrics"
    cluster.create_topic(topic_name, queues=2)
    stub = gateway.stub
    for _ in range(5):
        feeder = Feeder()
        call = open_stream(stub, feeder)
        for index in range(64):
            feeder.send(request(topic_name, *(f"m{index}-{m}" for m in range(50))))
        next(call)
        call.cancel()
        assert call.code() is grpc.StatusCode.CANCELLED
    wait_until(
        lambda: scrape(metrics_url).get("tide_gateway_produce_streams") == 0.0,
        "no ProduceStream open on the gateway",
    )
    health = health_pb2_grpc.HealthStub(gateway.channel)
    answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    before = scrape(metrics_url)["tide_gateway_produced_messages_total"]
    answers = stream(stub, [request(topic_name, "after", "cancel")] * 3)
    assert [a.error_code for a in answers] == [0, 0, 0]
    stream(stub, [pb.ProduceRequest()])  # an in-band INVALID_ARGUMENT
    counted = scrape(metrics_url)
    assert counted["tide_gateway_produced_messages_total"] == before + 6
    assert counted['tide_gateway_produce_stream_errors_total{code="INVALID_ARGUMENT"}'] == 1.0


def scrape(url: str) -> dict[str, float]:
    """The samples of a Prometheus endpoint: 'name' or 'name{label="value"}' (the
    otel_scope_* labels left out) -> value."""
    with urllib.request.urlopen(url, timeout=RPC_TIMEOUT_S) as answer:
        text = answer.read().decode()
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name, _, labels = series.partition("{")
        kept = [
            f'{key}="{text}"'
            for key, text in re.findall(r'(\w+)="([^"]*)"', labels)
            if not key.startswith("otel_scope_")
        ]
        samples[f"{name}{{{','.join(kept)}}}" if kept else name] = float(value)
    return samples


def test_gateway_stop_ends_an_open_stream_promptly(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=2)
    feeder = Feeder()
    with grpc.insecure_channel(cluster.gateway.listen) as channel:  # outlives the stop
        call = open_stream(pb_grpc.GatewayStub(channel), feeder, timeout_s=60)
        feeder.send(request(topic_name, "before stop"))
        assert next(call).error_code == 0
        ended_at: list[float] = []

        def read_rest() -> None:
            try:
                for _ in call:
                    pass
            except grpc.RpcError:
                pass  # the status is checked below
            ended_at.append(time.monotonic())

        reader = threading.Thread(target=read_rest, daemon=True)
        reader.start()
        started = time.monotonic()
        cluster.restart_gateway()  # stops this gateway (SIGTERM), starts another
        reader.join(timeout=STOP_WITHIN_S)
        feeder.close()
        assert ended_at, "the stream did not end when the gateway stopped"
        assert ended_at[0] - started < STOP_WITHIN_S
        assert call.code() is grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in (call.details() or "")


def test_reflection_lists_produce_stream(cluster: Cluster) -> None:
    database = ProtoReflectionDescriptorDatabase(cluster.gateway.channel)
    pool = descriptor_pool.DescriptorPool(database)
    method = pool.FindServiceByName("tide.v1.Gateway").methods_by_name["ProduceStream"]
    assert method.client_streaming and method.server_streaming
    assert method.input_type.full_name == "tide.v1.ProduceRequest"
    assert method.output_type.full_name == "tide.v1.ProduceStreamResponse"

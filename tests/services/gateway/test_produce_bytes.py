"""Produce memory bounded by bytes, through a real gateway process in front of a real
broker: clients pushing large requests fast (ProduceStream requests not waiting for
answers, concurrent streams) are back-pressured or refused RESOURCE_EXHAUSTED naming
the limit; the gateway's in-flight bytes (its metrics) stay under the limits, and every
acknowledged message is stored (nothing refused was written)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc

from services.gateway.query import MAX_QUERY_ANSWER_BYTES
from tests._cluster import MAX_BODY_BYTES, Cluster, cluster_fixture
from tests._metrics import scrape, total
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide import waiting
from tide.v1 import gateway_pb2 as pb

MIB = 1024 * 1024
GLOBAL_LIMIT_BYTES = 16 * MIB
STREAM_LIMIT_BYTES = 8 * MIB
BODY_BYTES = MAX_BODY_BYTES - 4096  # the largest body the test cluster takes, about
MESSAGES_PER_REQUEST = 64  # ~3.8 MiB per request
WAIT_S = 120.0
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]

cluster = cluster_fixture(
    brokers=1,
    gateway_args=(
        "--metrics-listen",
        "127.0.0.1:0",
        "--max-produce-in-flight-bytes",
        str(GLOBAL_LIMIT_BYTES),
        "--max-produce-stream-in-flight-bytes",
        str(STREAM_LIMIT_BYTES),
    ),
)


def big_request(topic: str, tag: int, messages: int = MESSAGES_PER_REQUEST) -> pb.ProduceRequest:
    return pb.ProduceRequest(
        messages=[
            pb.ProduceMessage(topic=topic, body=bytes([tag % 251]) * BODY_BYTES)
            for _ in range(messages)
        ]
    )


class Pusher:
    """A request iterator that hands out ``count`` large requests as fast as gRPC takes
    them and counts them (the answers are not read meanwhile)."""

    def __init__(self, topic: str, count: int) -> None:
        self.topic = topic
        self.count = count
        self.sent = 0

    def __iter__(self) -> Iterator[pb.ProduceRequest]:
        for index in range(self.count):
            yield big_request(self.topic, index)
            self.sent += 1


def metric(cluster: Cluster, name: str) -> float:
    return total(scrape(str(cluster.gateway.ready["metrics"])), name)


def wait_until(check: object, what: str) -> None:
    assert callable(check)
    waiting.wait_until(check, what, timeout_s=WAIT_S)


def stored_messages(cluster: Cluster, topic: str, queues: int) -> int:
    """Messages in the topic's queues (max - min offset summed)."""
    total = 0
    for queue_id in range(queues):
        reply = cluster.gateway.stub.GetQueueOffsets(
            pb.QueueOffsetsRequest(topic=topic, broker_name="broker-a", queue_id=queue_id),
            timeout=RPC_TIMEOUT_S,
        )
        total += reply.max_offset - reply.min_offset
    return total


def all_stored(cluster: Cluster, topic: str, queues: int, count: int) -> None:
    """The dispatch builds the queues behind the storage: wait until they hold ``count``
    messages, then check that no more arrive (nothing refused was written)."""
    wait_until(
        lambda: stored_messages(cluster, topic, queues) >= count,
        f"{count} messages in the queues of {topic}",
    )
    assert stored_messages(cluster, topic, queues) == count


def acknowledged(answers: list[pb.ProduceStreamResponse]) -> int:
    return sum(
        1
        for answer in answers
        if answer.error_code == 0
        for result in answer.response.results
        if result.status == pb.ProduceResult.SEND_OK
    )


def in_flight_settles(cluster: Cluster) -> None:
    """The gauges are sampled: wait until they show nothing in flight any more."""
    wait_until(
        lambda: (
            metric(cluster, "tide_gateway_produce_in_flight_bytes") == 0
            and metric(cluster, "tide_gateway_produce_in_flight_peak_bytes") > 0
        ),
        "the gateway's produce in-flight bytes back to 0",
    )


# The first test of the module: the peak gauge (a high-water mark since the gateway
# started) then shows this one stream alone.
def test_a_stream_pushing_large_requests_without_reading_answers_is_back_pressured(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=4)
    pusher = Pusher(topic_name, 16)  # ~61 MiB, 8 times the stream's limit
    call = cluster.gateway.stub.ProduceStream(iter(pusher), timeout=WAIT_S)
    # Every request is taken by the gateway before a single answer is read here.
    wait_until(lambda: pusher.sent == pusher.count, "the client to push every request")
    answers = list(call)
    assert len(answers) == pusher.count
    assert all(a.error_code == 0 for a in answers), [a.error_message for a in answers]
    assert acknowledged(answers) == pusher.count * MESSAGES_PER_REQUEST
    all_stored(cluster, topic_name, 4, pusher.count * MESSAGES_PER_REQUEST)
    in_flight_settles(cluster)
    # One stream never holds more than its limit plus the one request read at it (the
    # count bound alone, 32 requests, would have let ~120 MiB in).
    request_bytes = big_request(topic_name, 0).ByteSize()
    peak = metric(cluster, "tide_gateway_produce_in_flight_peak_bytes")
    assert 0 < peak < STREAM_LIMIT_BYTES + request_bytes, peak
    assert metric(cluster, "tide_gateway_produce_refused_total") == 0


def test_a_request_larger_than_the_gateway_budget_is_refused_naming_the_limit(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=2)
    huge = big_request(topic_name, 1, messages=GLOBAL_LIMIT_BYTES // BODY_BYTES + 8)
    assert huge.ByteSize() > GLOBAL_LIMIT_BYTES
    stub = cluster.gateway.stub
    expect_error(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        lambda: stub.Produce(huge, timeout=RPC_TIMEOUT_S),
        f"max_produce_in_flight_bytes ({GLOBAL_LIMIT_BYTES} bytes)",
        "send smaller requests",
    )
    # On a stream: answered in-band, and the stream goes on.
    small = big_request(topic_name, 2, messages=2)
    answers = list(stub.ProduceStream(iter([huge, small]), timeout=RPC_TIMEOUT_S))
    assert answers[0].error_code == EXHAUSTED
    refusal = answers[0].error_message
    assert f"max_produce_in_flight_bytes ({GLOBAL_LIMIT_BYTES} bytes)" in refusal
    assert answers[1].error_code == 0 and len(answers[1].response.results) == 2
    all_stored(cluster, topic_name, 2, 2)  # nothing of the refused one


def test_concurrent_streams_past_the_gateway_budget_lose_nothing_acknowledged(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=4)
    pushers = [Pusher(topic_name, 5) for _ in range(4)]  # 4 x ~19 MiB, all at once
    results: list[list[pb.ProduceStreamResponse]] = [[] for _ in pushers]
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            call = cluster.gateway.stub.ProduceStream(iter(pushers[index]), timeout=WAIT_S)
            results[index] = list(call)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(pushers))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + WAIT_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a stream did not end in time"
    assert not failures, failures
    answers = [answer for per_stream in results for answer in per_stream]
    assert len(answers) == sum(p.count for p in pushers)
    for answer in answers:  # written, or refused naming the limit (never anything else)
        if answer.error_code:
            assert answer.error_code == EXHAUSTED, answer.error_message
            assert "max_produce_in_flight_bytes" in answer.error_message
    all_stored(cluster, topic_name, 4, acknowledged(answers))
    in_flight_settles(cluster)
    assert metric(cluster, "tide_gateway_produce_in_flight_peak_bytes") <= GLOBAL_LIMIT_BYTES
    refused = sum(1 for a in answers if a.error_code)
    assert metric(cluster, "tide_gateway_produce_refused_total") >= refused


def test_a_key_query_answers_the_newest_messages_that_fit_its_byte_bound(
    cluster: Cluster, topic_name: str
) -> None:
    """~42 MB of messages under one key: the answer carries the newest of them, at most
    MAX_QUERY_ANSWER_BYTES (the storage Read and the answer stay bounded)."""
    cluster.create_topic(topic_name, queues=1)
    count, per_request = 700, 50
    stub = cluster.gateway.stub
    for _ in range(count // per_request):
        request = pb.ProduceRequest(
            messages=[
                pb.ProduceMessage(topic=topic_name, body=b"k" * BODY_BYTES, keys=["same-key"])
                for _ in range(per_request)
            ]
        )
        answer = stub.Produce(request, timeout=RPC_TIMEOUT_S)
        assert all(r.status == pb.ProduceResult.SEND_OK for r in answer.results)
    all_stored(cluster, topic_name, 1, count)

    def query() -> pb.QueryMessageResponse:
        return stub.QueryMessage(
            pb.QueryMessageRequest(
                key=pb.KeyQuery(topic=topic_name, key="same-key", max_count=1000)
            ),
            timeout=RPC_TIMEOUT_S,
        )

    # The index follows the consume queues: wait until it has the newest message.
    wait_until(
        lambda: any(m.message.queue_offset == count - 1 for m in query().messages),
        "the key index to reach the newest message",
    )
    reply = query()
    assert 0 < reply.ByteSize() <= MAX_QUERY_ANSWER_BYTES
    offsets = [m.message.queue_offset for m in reply.messages]
    assert len(offsets) < count  # cut by bytes, not by max_count
    assert offsets == list(range(count - 1, count - 1 - len(offsets), -1))  # the newest

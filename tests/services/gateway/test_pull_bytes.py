"""Pull memory bounded by bytes (issue 17, point 7), through a real gateway process: many
consumers pulling large messages at once wait for room under ``--max-pull-in-flight-bytes``
(backpressure, never an error), get every message, and the gateway's in-flight gauge never
shows more than the limit plus one pull's ``--max-pull-bytes``."""

from __future__ import annotations

import threading

from tests._cluster import MAX_BODY_BYTES, Cluster, cluster_fixture
from tests._metrics import scrape, total
from tests.services.gateway.conftest import RPC_TIMEOUT_S
from tide.format import decode_record
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until

KIB = 1024
MIB = 1024 * KIB
PULL_LIMIT_BYTES = MIB  # the option's minimum
MAX_PULL_BYTES = 256 * KIB  # each pull counts this while it reads: 4 fit at once
BODY_BYTES = MAX_BODY_BYTES - 4096  # ~60 KiB: about 4 messages a pull
QUEUES = 4
PER_QUEUE = 48
PULLERS_PER_QUEUE = 4  # 16 threads pulling at once, both encodings
WAIT_S = 120.0
Status = pb.PullResponse.Status
RECORDS = pb.PullRequest.ENCODING_RECORDS

cluster = cluster_fixture(
    brokers=1,
    gateway_args=(
        "--metrics-listen",
        "127.0.0.1:0",
        "--max-pull-bytes",
        str(MAX_PULL_BYTES),
        "--max-pull-in-flight-bytes",
        str(PULL_LIMIT_BYTES),
    ),
)


def body(queue_id: int, index: int) -> bytes:
    return bytes([(queue_id * PER_QUEUE + index) & 0xFF]) * BODY_BYTES


def produce(cluster: Cluster, topic: str) -> None:
    for queue_id in range(QUEUES):
        messages = [
            pb.ProduceMessage(
                topic=topic,
                body=body(queue_id, index),
                queue=pb.QueueRef(broker_name="broker-a", queue_id=queue_id),
            )
            for index in range(PER_QUEUE)
        ]
        cluster.gateway.stub.Produce(pb.ProduceRequest(messages=messages), timeout=RPC_TIMEOUT_S)


def bodies_of(answer: pb.PullResponse) -> list[bytes]:
    if not answer.record_count:
        return [message.body for message in answer.messages]
    bodies, pos = [], 0
    for _ in range(answer.record_count):
        record = decode_record(answer.records, pos, len(answer.records))
        bodies.append(record.body)
        pos += record.total_size
    return bodies


def pull_queue(cluster: Cluster, topic: str, queue_id: int, records: bool) -> list[bytes]:
    """Every body of the queue, pulled from offset 0 to the end (one pull at a time)."""
    got: list[bytes] = []
    offset = 0
    while offset < PER_QUEUE:
        answer = cluster.gateway.stub.Pull(
            pb.PullRequest(
                topic=topic,
                broker_name="broker-a",
                queue_id=queue_id,
                offset=offset,
                max_messages=64,
                encoding=RECORDS if records else pb.PullRequest.ENCODING_MESSAGES,
            ),
            timeout=WAIT_S,
        )
        assert answer.status == Status.FOUND, (queue_id, offset, answer.status)
        bodies = bodies_of(answer)
        assert len(bodies) > 0 and answer.next_offset == offset + len(bodies)
        got.extend(bodies)
        offset = answer.next_offset
    return got


def metric(cluster: Cluster, name: str) -> float:
    return total(scrape(str(cluster.gateway.ready["metrics"])), name)


def test_many_consumers_pulling_at_once_wait_under_the_limit_and_get_every_message(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=QUEUES)
    produce(cluster, topic_name)
    results: dict[tuple[int, int], list[bytes]] = {}
    failures: list[BaseException] = []

    def run(queue_id: int, puller: int) -> None:
        try:
            results[queue_id, puller] = pull_queue(cluster, topic_name, queue_id, puller % 2 == 1)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [
        threading.Thread(target=run, args=(queue_id, puller))
        for queue_id in range(QUEUES)
        for puller in range(PULLERS_PER_QUEUE)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not failures, failures
    for (queue_id, _), bodies in results.items():
        assert bodies == [body(queue_id, index) for index in range(PER_QUEUE)]
    assert len(results) == QUEUES * PULLERS_PER_QUEUE
    # The gauges are sampled: wait until they show the reads over.
    wait_until(
        lambda: (
            metric(cluster, "tide_gateway_pull_in_flight_bytes") == 0
            and metric(cluster, "tide_gateway_pull_in_flight_peak_bytes") > 0
        ),
        "the gateway's pull in-flight bytes back to 0",
        WAIT_S,
    )
    # A pull enters while less than the limit is counted: at most the limit plus one
    # pull's share (16 unbounded readers would have counted 4 MiB).
    peak = metric(cluster, "tide_gateway_pull_in_flight_peak_bytes")
    assert MAX_PULL_BYTES <= peak < PULL_LIMIT_BYTES + MAX_PULL_BYTES, peak

"""Pulls through the gateway over ReadStream and GetQueueEntriesStream in a real cluster:
many queues pulled at once ride a few streams per address, long polling still wakes on an
arrival, and an empty queue or an illegal offset answer as with the unary calls."""

from __future__ import annotations

import time

from services.gateway.read_streams import READ_STREAMS_PER_ADDRESS
from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S
from tide.v1 import gateway_pb2 as pb

QUEUES = 8
PER_QUEUE = 20
Status = pb.PullResponse.Status
pull_cluster = cluster_fixture(name="pull_cluster", brokers=1)


def opened(log: str, name: str) -> int:
    return sum(
        f"{name} stream from" in line and line.endswith(" opened") for line in log.splitlines()
    )


def pull(queue_id: int, offset: int = 0, long_poll_timeout_ms: int = 0) -> pb.PullRequest:
    return pb.PullRequest(
        topic="T_pull_streams",
        broker_name="broker-a",
        queue_id=queue_id,
        offset=offset,
        long_poll_timeout_ms=long_poll_timeout_ms,
    )


def test_pulls_ride_few_streams_and_long_polls_wake(pull_cluster: Cluster) -> None:
    cluster = pull_cluster
    stub = cluster.gateway.stub
    cluster.create_topic("T_pull_streams", queues=QUEUES)
    assert stub.Pull(pull(0), timeout=RPC_TIMEOUT_S).status == Status.NO_NEW_MESSAGE
    empty = stub.Pull(pull(0, 5), timeout=RPC_TIMEOUT_S)  # nothing dispatched: NOT_FOUND
    assert (empty.status, empty.next_offset) == (Status.OFFSET_ILLEGAL, 0)
    messages = [
        pb.ProduceMessage(
            topic="T_pull_streams",
            body=f"{queue}-{index}".encode(),
            queue=pb.QueueRef(broker_name="broker-a", queue_id=queue),
        )
        for queue in range(QUEUES)
        for index in range(PER_QUEUE)
    ]
    stub.Produce(pb.ProduceRequest(messages=messages), timeout=RPC_TIMEOUT_S)
    calls = [stub.Pull.future(pull(q % QUEUES), timeout=RPC_TIMEOUT_S) for q in range(64)]
    for index, call in enumerate(calls):
        answer = call.result()
        assert answer.status == Status.FOUND
        bodies = [m.body for m in answer.messages]
        assert bodies == [f"{index % QUEUES}-{i}".encode() for i in range(PER_QUEUE)]
    illegal = stub.Pull(pull(0, PER_QUEUE + 5), timeout=RPC_TIMEOUT_S)
    assert (illegal.status, illegal.next_offset) == (Status.OFFSET_ILLEGAL, PER_QUEUE)

    held = stub.Pull.future(pull(1, PER_QUEUE, long_poll_timeout_ms=20_000), timeout=30)
    cluster.gateway.wait_held(1)
    assert not held.done()
    started = time.monotonic()
    last = pb.ProduceMessage(
        topic="T_pull_streams", body=b"late", queue=pb.QueueRef(broker_name="broker-a", queue_id=1)
    )
    stub.Produce(pb.ProduceRequest(messages=[last]), timeout=RPC_TIMEOUT_S)
    answer = held.result()
    assert answer.status == Status.FOUND and [m.body for m in answer.messages] == [b"late"]
    assert time.monotonic() - started < 5

    broker = cluster.brokers[0]
    assert 1 <= opened(broker.storage.stderr(), "read") <= READ_STREAMS_PER_ADDRESS
    assert 1 <= opened(broker.dispatch.stderr(), "queue entries") <= READ_STREAMS_PER_ADDRESS

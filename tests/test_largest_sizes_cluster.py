"""The largest sizes the limits allow go all the way through real processes.

* The largest body any service may be configured for (tide.limits.MESSAGE_BODY_MAX_BYTES):
  produced through the gateway, stored by the master, copied by its slave (Replicate),
  followed by both dispatches (Tail), found by key and pulled whole. A record of that
  size is over the Tail's chunk (4 MiB) and a replication chunk: both carry raw
  commitlog bytes, and a record split over chunks is put together again by the follower,
  which takes any record a storage can write (RECORD_MAX_BYTES).
* The largest Produce the gateway accepts (PRODUCE_MAX_BYTES), made of many small
  messages too, so its records are larger than the request: stored whole (the storage
  takes APPEND_MAX_BYTES). One byte more is refused INVALID_ARGUMENT naming the limit,
  on Produce and in-band on ProduceStream, and writes nothing.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests._cluster import Cluster, cluster_fixture
from tests.services.dispatch.conftest import DispatchProcess
from tests.services.gateway.conftest import RPC_TIMEOUT_S
from tests.services.storage.conftest import REPO
from tide.limits import (
    APPEND_MAX_BYTES,
    MESSAGE_BODY_MAX_BYTES,
    PRODUCE_MAX_BYTES,
    PRODUCE_MESSAGES_MAX,
    PROPERTIES_MAX_BYTES,
    QUEUE_NUMS_MAX,
    RECORD_MAX_BYTES,
)
from tide.server import MAX_MESSAGE_BYTES
from tide.tail.follower import MAX_CHUNK_BYTES
from tide.v1 import gateway_pb2 as pb
from tide.v1.gateway_pb2_grpc import GatewayStub
from tide.waiting import wait_until

MIB = 1024 * 1024
TOPIC = "T_largest_body"
BODY_FLAG = ("--max-message-body-bytes", str(MESSAGE_BODY_MAX_BYTES))
WAIT_S = 120.0
PRODUCE_MESSAGES = 10_000  # the storages' default --max-batch-messages
INVALID = grpc.StatusCode.INVALID_ARGUMENT

cluster = cluster_fixture(
    brokers=1,
    replicas=2,
    storage_args=(*BODY_FLAG, "--segment-size-bytes", str(128 * MIB), "--no-warm-segments"),
    gateway_args=(*BODY_FLAG, "--max-produce-messages", str(PRODUCE_MESSAGES)),
)


def largest_message(queue_id: int) -> pb.ProduceMessage:
    """A body at the limit, with properties near theirs: a record near RECORD_MAX_BYTES."""
    body = bytes(range(256)) * (MESSAGE_BODY_MAX_BYTES // 256)
    assert len(body) == MESSAGE_BODY_MAX_BYTES
    filler = "p" * (PROPERTIES_MAX_BYTES - 200)  # the rest: tags, keys, the unique key
    return pb.ProduceMessage(
        topic=TOPIC,
        body=body,
        tags="big",
        keys=["largest"],
        properties={"filler": filler},
        queue=pb.QueueRef(broker_name="broker-a", queue_id=queue_id),
    )


def queue_max(dispatch: DispatchProcess, queue_id: int, topic: str = TOPIC) -> int:
    """The queue's max offset in this dispatch (0 before anything was dispatched to it)."""
    try:
        return dispatch.offsets(topic, queue_id).max_offset
    except grpc.RpcError as exc:
        if exc.code() is grpc.StatusCode.NOT_FOUND:
            return 0
        raise


def dispatched(cluster: Cluster, queue_id: int, count: int) -> None:
    """Both dispatches (master's and slave's) hold ``count`` entries of the queue."""
    for member in cluster.brokers[0].members:
        dispatch = member.dispatch
        wait_until(
            lambda dispatch=dispatch: queue_max(dispatch, queue_id) >= count,  # type: ignore[misc]
            f"the dispatch of broker-a id {member.broker_id} following {count} message(s)",
            timeout_s=WAIT_S,
        )
        assert queue_max(dispatch, queue_id) == count
        status = dispatch.status()
        assert (status.follower_state, status.last_error) == ("connected", ""), status


def test_a_message_of_the_largest_body_is_produced_replicated_dispatched_and_pulled(
    cluster: Cluster,
) -> None:
    cluster.create_topic(TOPIC, queues=1)
    message = largest_message(0)
    reply = cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=[message]), timeout=RPC_TIMEOUT_S
    )
    (result,) = reply.results
    assert result.status == pb.ProduceResult.SEND_OK, result.error
    # A second one behind it: the followers went past the large record, not just to it.
    small = pb.ProduceMessage(topic=TOPIC, body=b"after", queue=message.queue)
    assert (
        cluster.gateway.stub.Produce(pb.ProduceRequest(messages=[small]), timeout=RPC_TIMEOUT_S)
        .results[0]
        .status
        == pb.ProduceResult.SEND_OK
    )
    dispatched(cluster, 0, 2)
    broker = cluster.brokers[0]
    master = broker.master.storage.status()
    wait_until(
        lambda: broker.slaves[0].storage.status().max_offset == master.max_offset,
        "the slave holding the master's commitlog",
        timeout_s=WAIT_S,
    )

    answer = cluster.gateway.stub.Pull(
        pb.PullRequest(
            consumer_group="G_largest",
            topic=TOPIC,
            broker_name="broker-a",
            queue_id=0,
            offset=0,
            max_messages=2,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert answer.status == pb.PullResponse.FOUND
    assert [m.body for m in answer.messages][:1] == [message.body]
    assert answer.messages[0].properties["filler"] == message.properties["filler"]
    assert 0 < answer.messages[0].size <= RECORD_MAX_BYTES
    assert answer.messages[0].size > MESSAGE_BODY_MAX_BYTES + PROPERTIES_MAX_BYTES - 200
    found = cluster.gateway.stub.QueryMessage(
        pb.QueryMessageRequest(key=pb.KeyQuery(topic=TOPIC, key="largest")),
        timeout=RPC_TIMEOUT_S,
    )
    assert [m.message.body for m in found.messages] == [message.body]


def test_the_slave_serves_the_largest_record(cluster: Cluster) -> None:
    """The slave's copy is whole: its storage reads the record the master wrote."""
    broker = cluster.brokers[0]
    slave = broker.slaves[0].storage
    master_status = broker.master.storage.status()
    wait_until(
        lambda: slave.status().max_offset == master_status.max_offset,
        "the slave caught up",
        timeout_s=WAIT_S,
    )
    (read,) = slave.read([(0, 0)])
    assert len(read.message.body) == MESSAGE_BODY_MAX_BYTES
    assert read.message.topic == TOPIC


@pytest.mark.parametrize("service", ["storage", "gateway"])
def test_a_body_limit_over_the_ceiling_is_refused_at_start(service: str, tmp_path: Path) -> None:
    """One ceiling for every service's --max-message-body-bytes."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            f"services.{service}",
            "--max-message-body-bytes",
            str(MESSAGE_BODY_MAX_BYTES + 1),
            *(("--store-dir", str(tmp_path / "store")) if service == "storage" else ()),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert (
        f"--max-message-body-bytes: {MESSAGE_BODY_MAX_BYTES + 1} is outside "
        f"1..{MESSAGE_BODY_MAX_BYTES}"
    ) in done.stderr


# -- the largest Produce ----------------------------------------------------------------
def request_of(size_bytes: int, topic: str) -> pb.ProduceRequest:
    """A Produce of exactly ``size_bytes`` serialized: two large bodies, as many small
    messages as a request may have (each grows by ~150 bytes as a record: together over
    a megabyte more as records), and a last body sized to make up the rest."""
    big = b"B" * (MESSAGE_BODY_MAX_BYTES - MIB)
    smalls = [
        pb.ProduceMessage(topic=topic, body=b"s", tags="t", keys=[f"k{index}"])
        for index in range(PRODUCE_MESSAGES - 3)
    ]
    request = pb.ProduceRequest(
        messages=[
            pb.ProduceMessage(topic=topic, body=big),
            pb.ProduceMessage(topic=topic, body=big),
            *smalls,
            pb.ProduceMessage(topic=topic, body=b""),
        ]
    )
    last = request.messages[-1]
    for _ in range(5):  # a length's varint may grow by a byte as the body does
        missing = size_bytes - request.ByteSize()
        if missing == 0:
            return request
        last.body = b"L" * (len(last.body) + missing)
    raise AssertionError(f"no request of exactly {size_bytes} bytes")


@pytest.fixture(scope="module")
def gateway_channel(cluster: Cluster) -> Iterator[grpc.Channel]:
    """A channel that sends requests past PRODUCE_MAX_BYTES (tide.client does not)."""
    channel = grpc.insecure_channel(
        cluster.gateway.listen,
        options=[
            ("grpc.max_send_message_length", APPEND_MAX_BYTES),
            ("grpc.max_receive_message_length", APPEND_MAX_BYTES),
        ],
    )
    yield channel
    channel.close()


def test_the_largest_produce_is_stored_whole(
    cluster: Cluster, gateway_channel: grpc.Channel
) -> None:
    topic = "T_largest_produce"
    cluster.create_topic(topic, queues=1)
    request = request_of(PRODUCE_MAX_BYTES, topic)
    records_bytes = sum(len(m.body) for m in request.messages) + PRODUCE_MESSAGES * 91
    assert records_bytes > MAX_MESSAGE_BYTES  # what a storage took at most before
    reply = GatewayStub(gateway_channel).Produce(request, timeout=WAIT_S)
    statuses = {result.status for result in reply.results}
    assert statuses == {pb.ProduceResult.SEND_OK}, [r.error for r in reply.results][:3]
    assert len(reply.results) == PRODUCE_MESSAGES
    dispatch = cluster.brokers[0].dispatch
    wait_until(
        lambda: queue_max(dispatch, 0, topic) >= PRODUCE_MESSAGES,
        f"{PRODUCE_MESSAGES} messages dispatched",
        timeout_s=WAIT_S,
    )
    assert queue_max(dispatch, 0, topic) == PRODUCE_MESSAGES


def test_one_byte_more_is_refused_naming_the_limit(
    cluster: Cluster, gateway_channel: grpc.Channel
) -> None:
    topic = "T_produce_too_large"
    cluster.create_topic(topic, queues=1)
    request = request_of(PRODUCE_MAX_BYTES + 1, topic)
    stub = GatewayStub(gateway_channel)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Produce(request, timeout=WAIT_S)
    assert refused.value.code() is INVALID
    expected = (
        f"the request is {PRODUCE_MAX_BYTES + 1} bytes; the limit is "
        f"{PRODUCE_MAX_BYTES} bytes (PRODUCE_MAX_BYTES)"
    )
    assert expected in (refused.value.details() or "")
    # In-band on a stream, which goes on.
    small = pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic, body=b"ok")])
    answers = list(stub.ProduceStream(iter([request, small]), timeout=WAIT_S))
    assert [answer.error_code for answer in answers] == [INVALID.value[0], 0]
    assert expected in answers[0].error_message
    assert answers[1].response.results[0].status == pb.ProduceResult.SEND_OK
    # Nothing of the refused requests was written: the queue holds the small one only.
    dispatch = cluster.brokers[0].dispatch
    wait_until(lambda: queue_max(dispatch, 0, topic) >= 1, "the small message dispatched")
    storage = cluster.brokers[0].storage.status()
    wait_until(
        lambda: dispatch.status().dispatched_offset >= storage.max_offset,
        "the dispatch at the storage's end",
    )
    assert queue_max(dispatch, 0, topic) == 1


@pytest.mark.parametrize(
    ("flag", "value", "high"),
    [
        ("--max-batch-messages", PRODUCE_MESSAGES_MAX + 1, PRODUCE_MESSAGES_MAX),
        ("--default-queue-nums", QUEUE_NUMS_MAX + 1, QUEUE_NUMS_MAX),
        ("--tail-max-chunk-bytes", MAX_CHUNK_BYTES + 1, MAX_CHUNK_BYTES),
    ],
)
def test_a_storage_limit_past_its_ceiling_is_refused_at_start(
    flag: str, value: int, high: int, tmp_path: Path
) -> None:
    """The storage's options bounded by tide.limits: one ceiling each, checked at start."""
    done = subprocess.run(
        [sys.executable, "-m", "services.storage", flag, str(value), "--store-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"{flag}: {value} is outside 1..{high}" in done.stderr

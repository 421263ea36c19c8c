"""The largest body any service may be configured for (tide.limits.MESSAGE_BODY_MAX_BYTES)
goes all the way through real processes: produced through the gateway, stored by the
master, copied by its slave (Replicate), followed by both dispatches (Tail), found by key
and pulled whole from master and slave.

A record of that size is over the Tail's chunk (4 MiB) and a replication chunk: both
carry raw commitlog bytes, a record split over chunks is put together again by the
follower, which takes any record a storage can write (RECORD_MAX_BYTES).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tests._cluster import Cluster, cluster_fixture
from tests.services.dispatch.conftest import DispatchProcess
from tests.services.gateway.conftest import RPC_TIMEOUT_S
from tests.services.storage.conftest import REPO
from tide.limits import MESSAGE_BODY_MAX_BYTES, PROPERTIES_MAX_BYTES, RECORD_MAX_BYTES
from tide.v1 import gateway_pb2 as pb

MIB = 1024 * 1024
TOPIC = "T_largest_body"
BODY_FLAG = ("--max-message-body-bytes", str(MESSAGE_BODY_MAX_BYTES))
WAIT_S = 120.0

cluster = cluster_fixture(
    brokers=1,
    replicas=2,
    storage_args=(*BODY_FLAG, "--segment-size-bytes", str(64 * MIB), "--no-warm-segments"),
    gateway_args=BODY_FLAG,
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


def queue_max(dispatch: DispatchProcess, queue_id: int) -> int:
    """The queue's max offset in this dispatch (0 before anything was dispatched to it)."""
    try:
        return dispatch.offsets(TOPIC, queue_id).max_offset
    except grpc.RpcError as exc:
        if exc.code() is grpc.StatusCode.NOT_FOUND:
            return 0
        raise


def dispatched(cluster: Cluster, queue_id: int, count: int) -> None:
    """Both dispatches (master's and slave's) hold ``count`` entries of the queue."""
    for member in cluster.brokers[0].members:
        dispatch = member.dispatch
        Cluster.wait_for(
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
    Cluster.wait_for(
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
    Cluster.wait_for(
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

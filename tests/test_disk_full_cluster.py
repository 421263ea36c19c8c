"""Issue 17's scenario end to end: a cluster whose broker (storage and dispatch) lives on
a small real disk (a tmpfs); produced through the gateway until the disk is full, the
producer gets RESOURCE_EXHAUSTED naming the store, not INTERNAL; once space is freed,
produce works again without a restart and every acknowledged message is consumed."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests._cluster import Cluster
from tests._tmpfs import fill, mounted_tmpfs
from tests.services.storage.conftest import SEGMENT_BYTES, segment_files
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until

RPC_TIMEOUT_S = 20.0
DISK_BYTES = 8 * SEGMENT_BYTES
BODY_BYTES = 60 * 1024
# Thresholds at 100 %: a refusal means the next segment cannot be allocated, and
# retention deletes nothing (every acknowledged message stays to be consumed).
FULL_DISK_ARGS = (
    "--disk-clean-ratio",
    "1.0",
    "--disk-clean-force-ratio",
    "1.0",
    "--disk-refuse-writes-ratio",
    "1.0",
)


def produce(cluster: Cluster, topic: str, index: int) -> pb.ProduceResult:
    body = index.to_bytes(4, "big") * (BODY_BYTES // 4)
    request = pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic, body=body)])
    (result,) = cluster.gateway.stub.Produce(request, timeout=RPC_TIMEOUT_S).results
    return result


def consumed_indexes(cluster: Cluster, topic: str, queue_id: int) -> list[int]:
    indexes: list[int] = []
    offset = 0
    while True:
        request = pb.PullRequest(
            consumer_group="G_disk",
            topic=topic,
            broker_name="broker-a",
            queue_id=queue_id,
            offset=offset,
            max_messages=32,
        )
        answer = cluster.gateway.stub.Pull(request, timeout=RPC_TIMEOUT_S)
        if not answer.messages:
            return indexes
        indexes += [int.from_bytes(m.body[:4], "big") for m in answer.messages]
        offset = answer.next_offset


def test_produce_on_a_full_disk_answers_resource_exhausted_then_resumes(tmp_path: Path) -> None:
    topic_name = "T_disk_full"
    root = tmp_path / "cluster"
    with (
        mounted_tmpfs(root / "stores", DISK_BYTES),
        Cluster(root, brokers=1, storage_args=FULL_DISK_ARGS) as cluster,
    ):
        storage = cluster.brokers[0].storage
        cluster.create_topic(topic_name, queues=2)
        wait_until(lambda: len(segment_files(storage.store_dir)) == 2, "the next segment")
        filler = root / "stores" / "filler"
        fill(filler, SEGMENT_BYTES // 2)

        acked: list[int] = []
        for index in range(10 * DISK_BYTES // BODY_BYTES):
            try:
                result = produce(cluster, topic_name, index)
            except grpc.RpcError as exc:
                assert isinstance(exc, grpc.Call)
                details = exc.details() or ""
                assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, details
                assert str(storage.store_dir) in details, details
                break
            assert result.status == pb.ProduceResult.SEND_OK, result
            acked.append(index)
        else:
            pytest.fail(f"{len(acked)} messages of {BODY_BYTES} bytes fit on {DISK_BYTES}")
        assert not storage.status().writable

        filler.unlink()
        refusals: list[grpc.RpcError] = []

        def produced() -> bool:
            try:
                produce(cluster, topic_name, len(acked))
            except grpc.RpcError as exc:
                assert isinstance(exc, grpc.Call) and exc.code() in (
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    grpc.StatusCode.UNAVAILABLE,  # the broker isolated for a moment
                ), exc
                refusals.append(exc)
                return False
            return True

        # The storage re-measures within 100 ms; the gateway retries it.
        wait_until(
            produced, "produce accepted again", 30, interval_s=0.1, state=lambda: refusals[-1:]
        )
        acked.append(len(acked))
        assert storage.status().writable
        last = cluster.brokers[0].storage.status().max_offset
        cluster.brokers[0].dispatch.wait_dispatched(last)
        consumed = sorted(
            consumed_indexes(cluster, topic_name, 0) + consumed_indexes(cluster, topic_name, 1)
        )
        assert consumed == acked

"""A Receive's checkpoint run survives a SIGKILL of the dispatch, partly acked (docs/pop.md,
"Durability and recovery"; docs/formats.md, "POP layouts"): the restarted dispatch reads
the run record back from the revive log and the ack record after it, holds again only
the checkpoints not acked, and delivers those again once their invisible time passes;
the acked ones never come again."""

from __future__ import annotations

from pathlib import Path

import grpc

from tests._cluster import Cluster
from tide.format import decode_handle, revive_offset_of
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.waiting import wait_until

MESSAGES = 6
RPC_TIMEOUT_S = 10.0
WAIT_S = 90.0
INVISIBLE_MS = 10_000  # the least a Receive may ask


def test_a_partly_acked_run_is_held_again_after_a_dispatch_sigkill(tmp_path: Path) -> None:
    with Cluster(
        tmp_path,
        brokers=1,
        storage_args=("--flush", "sync"),
        dispatch_args=("--pop-revive-interval-ms", "100", "--pop-offset-flush-interval-ms", "100"),
    ) as cluster:
        topic, group = "T_pop_runs", "G_pop_runs"
        cluster.create_topic(topic, queues=1)
        stub = cluster.gateway.stub
        stub.Produce(
            pb.ProduceRequest(
                messages=[
                    pb.ProduceMessage(topic=topic, body=b"m", keys=[f"k{i}"])
                    for i in range(MESSAGES)
                ]
            ),
            timeout=RPC_TIMEOUT_S,
        )
        cluster.wait_dispatched(topic, MESSAGES)
        got: list[pb.ReceivedMessage] = []
        wait_until(
            lambda: (
                len(got.__iadd__(_receive(stub, topic, group, MESSAGES - len(got)))) >= MESSAGES
            ),
            f"{MESSAGES} messages received",
            WAIT_S,
        )
        runs = {revive_offset_of(decode_handle(m.receipt_handle).checkpoint_offset) for m in got}
        assert len(runs) < MESSAGES  # at least one Receive wrote several in one record
        acked, open_ = got[::2], got[1::2]  # every run partly acked
        answer = stub.Ack(
            pb.AckRequest(
                consumer_group=group,
                topic=topic,
                entries=[pb.AckEntry(receipt_handle=m.receipt_handle) for m in acked],
            ),
            timeout=RPC_TIMEOUT_S,
        )
        assert [r.error for r in answer.results] == [pb.POP_ERROR_NONE] * len(acked)

        member = cluster.brokers[0].master
        member.dispatch.kill()
        cluster.restart_dispatch(member)

        again: list[pb.ReceivedMessage] = []

        def received_again() -> bool:
            try:
                again.extend(_receive(stub, topic, group, MESSAGES))
            except grpc.RpcError:
                return False  # the dispatch is still starting
            return len(again) >= len(open_)

        wait_until(received_again, "the messages not acked delivered again", WAIT_S)
        assert sorted(m.message.keys[0] for m in again) == sorted(m.message.keys[0] for m in open_)
        assert all(m.delivery_attempt == 2 for m in again)


def _receive(
    stub: pb_grpc.GatewayStub, topic: str, group: str, count: int
) -> list[pb.ReceivedMessage]:
    reply = stub.Receive(
        pb.ReceiveRequest(
            consumer_group=group,
            topic=topic,
            max_messages=count,
            invisible_duration_ms=INVISIBLE_MS,
            long_poll_timeout_ms=500,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    return list(reply.messages)

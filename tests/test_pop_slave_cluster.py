"""A slave holds the POP state by replication (docs/pop.md, "Durability and recovery"):
after a run of Receives and Acks on the master, the slave's store has the revive log's
checkpoint and ack records (replicated commitlog, dispatched by the slave's own
dispatch) and, through the metadata sync, the POP group's pop offsets and the revive
group's progress as the master wrote them. No promotion: only what a promoted slave
would start from is checked."""

from __future__ import annotations

from pathlib import Path

from tests._cluster import Cluster
from tests.services.storage.conftest import StorageProcess
from tide.format import (
    ACK_TAG,
    CHECKPOINTS_TAG,
    REVIVE_GROUP,
    REVIVE_QUEUE_ID,
    REVIVE_TOPIC,
    decode_ack,
    decode_checkpoints,
    decode_handle,
    revive_offset_of,
)
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

RPC_TIMEOUT_S = 20
WAIT_S = 60
INVISIBLE_MS = 60_000


def test_a_slave_has_the_checkpoints_acks_and_pop_offsets(tmp_path: Path) -> None:
    with Cluster(
        tmp_path,
        brokers=1,
        replicas=2,
        master_role="SYNC_MASTER",
        storage_args=("--metadata-sync-interval-ms", "200"),
        dispatch_args=("--pop-offset-flush-interval-ms", "100"),
    ) as cluster:
        topic, group = "T_pop_slave", "G_pop_slave"
        stub = cluster.gateway.stub
        cluster.create_topic(topic, queues=1)
        stub.Produce(
            pb.ProduceRequest(
                messages=[pb.ProduceMessage(topic=topic, body=f"m{i}".encode()) for i in range(4)]
            ),
            timeout=RPC_TIMEOUT_S,
        )
        cluster.wait_dispatched(topic, 4)
        got: list[pb.ReceivedMessage] = []
        wait_until(
            lambda: (
                len(
                    got.__iadd__(
                        stub.Receive(
                            pb.ReceiveRequest(
                                consumer_group=group,
                                topic=topic,
                                max_messages=4 - len(got),
                                invisible_duration_ms=INVISIBLE_MS,
                            ),
                            timeout=RPC_TIMEOUT_S,
                        ).messages
                    )
                )
                >= 4
            ),
            "4 messages received",
        )
        acked = stub.Ack(
            pb.AckRequest(
                consumer_group=group,
                topic=topic,
                entries=[pb.AckEntry(receipt_handle=m.receipt_handle) for m in got[:2]],
            ),
            timeout=RPC_TIMEOUT_S,
        )
        assert [r.error for r in acked.results] == [pb.POP_ERROR_NONE] * 2

        master, slave = cluster.brokers[0].master, cluster.brokers[0].slaves[0]

        def offset(storage: StorageProcess, group: str, topic: str) -> int:
            request = storage_pb.GetOffsetRequest(consumer_group=group, topic=topic, queue_id=0)
            return int(storage.stub.GetOffset(request, timeout=RPC_TIMEOUT_S).offset)

        # Checkpoint names (receipt handles carry them): the Receives wrote one checkpoint
        # run record each, so the revive progress is the revive offset of the record that
        # holds the oldest checkpoint not acked (the 3rd message's: the first two are).
        names = [decode_handle(m.receipt_handle).checkpoint_offset for m in got]
        progress = min(revive_offset_of(name) for name in names[2:])
        runs = len({revive_offset_of(name) for name in names})  # the Receives that got some

        # The master wrote the pop offset (past the 4) and the revive progress.
        wait_until(
            lambda: (
                offset(master.storage, group, topic) == 4
                and offset(master.storage, REVIVE_GROUP, REVIVE_TOPIC) == progress
            ),
            "the master's pop offset and revive progress written",
            timeout_s=WAIT_S,
            state=lambda: (
                offset(master.storage, group, topic),
                offset(master.storage, REVIVE_GROUP, REVIVE_TOPIC),
            ),
        )
        wait_until(
            lambda: (
                offset(slave.storage, group, topic) == 4
                and offset(slave.storage, REVIVE_GROUP, REVIVE_TOPIC) == progress
            ),
            "the slave's copies of the pop offset and revive progress",
            timeout_s=WAIT_S,
            state=lambda: (
                offset(slave.storage, group, topic),
                offset(slave.storage, REVIVE_GROUP, REVIVE_TOPIC),
            ),
        )

        # The revive log on the slave: the checkpoint runs of the 4 messages, then the one
        # ack record of the Ack call that resolved the first two (an ack record lists up
        # to ACK_RECORD_MAX_OFFSETS checkpoints), the master's records.
        wait_until(
            lambda: slave.dispatch.offsets(REVIVE_TOPIC, REVIVE_QUEUE_ID).max_offset > runs,
            "the slave's dispatch to hold the revive log",
            timeout_s=WAIT_S,
        )
        entries = slave.dispatch.entries(REVIVE_TOPIC, REVIVE_QUEUE_ID).entries
        results = slave.storage.read((e.physical_offset, e.size) for e in entries)
        assert all(r.status == storage_pb.FOUND for r in results)
        tags = [r.message.tags for r in results]
        assert tags == [CHECKPOINTS_TAG] * runs + [ACK_TAG]
        ack = decode_ack(results[runs].message.body)
        assert sorted((ack.checkpoint_offset, *ack.more)) == sorted(names[:2])
        checkpoints = [ck for r in results[:runs] for ck in decode_checkpoints(r.message.body)]
        assert [(ck.group, ck.topic, ck.queue_offset) for ck in checkpoints] == [
            (group, topic, i) for i in range(4)
        ]
        assert sorted(m.message.queue_offset for m in got) == [0, 1, 2, 3]

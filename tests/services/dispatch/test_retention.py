"""Retention end to end: a real storage deletes expired commitlog segments while a real
dispatch follows it, and dispatch's periodic cleanup then deletes the consume queue
segments and index files that only point below the commitlog's new min offset.

Storage runs with a retention of under 2 s and a disk-clean ratio of 1 %, so every
cleanup pass (each 200 ms) deletes the segments not written for that long.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from tests.services.dispatch.conftest import DispatchLauncher
from tests.services.dispatch.test_service import query
from tests.services.storage.conftest import StorageLauncher, message
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

SEGMENT_BYTES = 128 * 1024
RETENTION_ARGS = (
    "--segment-size-bytes",
    str(SEGMENT_BYTES),
    "--max-message-body-bytes",
    "1024",
    "--retention-hours",
    "0.0005",  # 1.8 s
    "--cleanup-interval-ms",
    "200",
    "--disk-clean-ratio",
    "0.01",  # any real disk is fuller: expired segments go at every pass
    "--disk-clean-force-ratio",
    "0.98",
    "--disk-refuse-writes-ratio",
    "0.99",
)
MESSAGES = 5_000
QUEUES = 2
# 1,000 entries per consume queue segment and 4,000 keys per index file (conftest): the
# 5,000 keys fill two index files, and the first one goes.
CQ_ENTRIES_PER_SEGMENT = 1_000
CQ_ENTRY_BYTES = 20


def test_retention_deletes_segments_and_dispatch_cleans_up_below_the_min(
    tmp_path: Path,
    launchers: tuple[StorageLauncher, DispatchLauncher],
) -> None:
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store", *RETENTION_ARGS)
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen)
    topic = "T_retention"

    def send(first: int, count: int) -> None:
        for start in range(first, first + count, 100):
            storage.append(
                [
                    message(topic, i % QUEUES, body=b"x" * 128, keys=[f"k{i}"])
                    for i in range(start, min(start + 100, first + count))
                ]
            )

    send(0, MESSAGES)
    max_offset = storage.status().max_offset
    assert max_offset > 5 * SEGMENT_BYTES, max_offset  # several segments to delete
    dispatch.wait_dispatched(max_offset)
    cq_dir = tmp_path / "dispatch" / "consumequeue" / topic
    index_dir = tmp_path / "dispatch" / "index"
    # (Retention may already be deleting while dispatch catches up: no "before" listing.)

    # Storage deletes every expired segment but the one it writes to ...
    wait_until(lambda: storage.status().segment_count == 1, "retention to delete segments")
    storage_min = storage.status().min_offset
    assert storage_min > 0

    # ... and dispatch drops what only points below storage's new min offset (once a
    # cleanup pass has seen that min: a pass between two deletions saw an older one).
    def first_physical(queue_id: int) -> int | None:
        """The commitlog offset of the queue's first entry; None when a cleanup pass moved
        the min between the two calls (OUT_OF_RANGE: ask again)."""
        low = dispatch.offsets(topic, queue_id).min_offset
        try:
            reply = dispatch.entries(topic, queue_id, offset=low)
        except grpc.RpcError as exc:
            if isinstance(exc, grpc.Call) and exc.code() is grpc.StatusCode.OUT_OF_RANGE:
                return None
            raise
        return reply.entries[0].physical_offset

    def cleaned_up(queue_id: int) -> bool:
        first = first_physical(queue_id)
        return first is not None and first >= storage_min

    def cleaned() -> bool:
        return (
            all(dispatch.offsets(topic, q).min_offset > 0 for q in range(QUEUES))
            and all(cleaned_up(q) for q in range(QUEUES))
            and len(list(index_dir.iterdir())) == 1
        )

    wait_until(cleaned, "dispatch cleanup below the commitlog min offset")
    for queue_id in range(QUEUES):
        offsets = dispatch.offsets(topic, queue_id)
        files = sorted(p.name for p in (cq_dir / str(queue_id)).iterdir())
        # Whole files go: the first file left holds the min offset ...
        first_file = offsets.min_offset // CQ_ENTRIES_PER_SEGMENT * CQ_ENTRIES_PER_SEGMENT
        assert files[0] == f"{first_file * CQ_ENTRY_BYTES:020d}", (files, offsets)
        assert offsets.max_offset == MESSAGES // QUEUES, offsets
        # ... and the min is the first entry still in the commitlog (RocketMQ's corrected
        # min logic offset), readable from storage.
        first = dispatch.entries(topic, queue_id, offset=offsets.min_offset).entries[0]
        assert first.queue_offset == offsets.min_offset
        assert first.physical_offset >= storage_min, (first, storage_min)
        (found,) = storage.read([(first.physical_offset, first.size)])
        assert found.status == storage_pb.FOUND, found

    # Keys of deleted messages find nothing; keys of kept ones still do.
    assert query(dispatch, topic, "k0") == []
    assert [h.physical_offset for h in query(dispatch, topic, f"k{MESSAGES - 1}")] == [
        dispatch.entries(topic, (MESSAGES - 1) % QUEUES, offset=MESSAGES // QUEUES - 1)
        .entries[0]
        .physical_offset
    ]

    # Dispatch keeps following: new messages land after the cleanup.
    send(MESSAGES, 200)
    dispatch.wait_dispatched(storage.status().max_offset)
    for queue_id in range(QUEUES):
        assert dispatch.offsets(topic, queue_id).max_offset == (MESSAGES + 200) // QUEUES
    newest = [
        (e.physical_offset, e.size)
        for q in range(QUEUES)
        for e in dispatch.entries(topic, q, offset=(MESSAGES + 200) // QUEUES - 10).entries
    ]
    assert len(newest) == 10 * QUEUES
    assert all(r.status == storage_pb.FOUND for r in storage.read(newest))

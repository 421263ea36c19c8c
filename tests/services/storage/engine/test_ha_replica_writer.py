"""The slave's writer, in process: a real master store's bytes (``read_raw``, chunks of
random sizes) written into a real slave store give identical segments, queue offsets
and a slave that recovers like a master."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from services.storage.engine.ha_replica_writer import (
    ReplicationError,
    ReplicaWriter,
    tail_range,
)
from services.storage.engine.message_store import MessageStore
from tests.services.storage.engine.conftest import SEGMENT_BYTES, StoreFactory, msg

TOPICS = ("HaA", "HaB")


def produce(store: MessageStore, count: int, rng: random.Random) -> None:
    for _ in range(count):
        batch = [
            msg(
                rng.choice(TOPICS),
                rng.randrange(4),
                bytes([97 + rng.randrange(26)]) * rng.randrange(0, 9000),
            )
            for _ in range(rng.randrange(1, 5))
        ]
        store.put(batch)


def copy(master: MessageStore, writer: ReplicaWriter, rng: random.Random) -> int:
    """Stream the master's readable bytes to the writer; returns chunks sent."""
    offset, chunks = writer.max_offset, 0
    writer.begin(offset, "master")
    while True:
        _, data = master.commitlog.read_raw(offset, rng.randrange(1, 40_000))
        if not data:
            return chunks
        writer.write(offset, data)
        offset += len(data)
        chunks += 1


def assert_identical(master: MessageStore, slave: MessageStore) -> None:
    assert slave.segments.max_offset == master.segments.max_offset
    assert slave.segments.min_offset == master.segments.min_offset
    for segment in master.segments.segments:
        if not segment.wrote:
            continue
        other = slave.segments.find(segment.start_offset)
        assert other is not None and other.path.name == segment.path.name
        assert other.wrote == segment.wrote
        assert bytes(other.mm) == bytes(segment.mm), segment.path.name
    assert slave.commitlog.offsets.next_offsets == master.commitlog.offsets.next_offsets
    assert slave.commitlog.last_store_timestamp_ms == master.commitlog.last_store_timestamp_ms


def test_chunks_of_any_size_give_identical_segments_and_queue_offsets(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    rng = random.Random(5)
    master = make_store(store_dir=tmp_path / "master")
    slave = make_store(store_dir=tmp_path / "slave")
    slave.refuse_puts("slave")
    writer = ReplicaWriter(slave)
    produce(master, 150, rng)
    assert master.segments.max_offset > 3 * SEGMENT_BYTES  # blank markers were copied
    assert copy(master, writer, rng) > 20
    assert_identical(master, slave)
    produce(master, 40, rng)  # continue from where it was
    copy(master, writer, rng)
    assert_identical(master, slave)
    master.close()
    slave.close()
    snapshots = [
        json.loads((d / "queue_offsets.json").read_text())
        for d in (master.config.store_dir, slave.config.store_dir)
    ]
    assert snapshots[0] == snapshots[1]


def test_a_record_cut_by_a_chunk_end_is_published_only_when_whole(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    master = make_store(store_dir=tmp_path / "master")
    slave = make_store(store_dir=tmp_path / "slave")
    writer = ReplicaWriter(slave)
    batch = master.put([msg("HaA", 0, b"x" * 500), msg("HaA", 0, b"y" * 500)]).batch
    first_end = batch.positions[1][0]
    writer.begin(0, "master")
    _, data = master.commitlog.read_raw(0, first_end + 100)
    assert writer.write(0, data) == first_end  # the second record is not whole yet
    assert slave.commitlog.offsets.next_offsets == {("HaA", 0): 1}
    _, rest = master.commitlog.read_raw(len(data), 10_000)
    assert writer.write(len(data), rest) == batch.end_offset
    assert slave.commitlog.offsets.next_offsets == {("HaA", 0): 2}


def test_longer_tail_is_truncated_to_the_masters_and_offsets_rebuilt(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    rng = random.Random(7)
    master = make_store(store_dir=tmp_path / "master")
    slave = make_store(store_dir=tmp_path / "slave")
    produce(master, 60, rng)
    writer = ReplicaWriter(slave)
    copy(master, writer, rng)
    cut = master.segments.max_offset
    offsets_at_cut = dict(master.commitlog.offsets.next_offsets)
    # The slave gets more than the master will have: bytes from a copy that goes on.
    produce(master, 30, rng)
    copy(master, writer, rng)
    assert slave.segments.max_offset > cut
    writer.begin(cut, "master")
    assert slave.segments.max_offset == cut
    assert slave.commitlog.offsets.next_offsets == offsets_at_cut
    slave.close()
    reopened = make_store(store_dir=tmp_path / "slave")
    assert reopened.segments.max_offset == cut
    assert reopened.commitlog.offsets.next_offsets == offsets_at_cut


def test_gaps_and_foreign_bytes_are_refused(make_store: StoreFactory, tmp_path: Path) -> None:
    slave = make_store(store_dir=tmp_path / "slave")
    writer = ReplicaWriter(slave)
    with pytest.raises(ReplicationError, match="below the min offset"):
        writer.begin(SEGMENT_BYTES, "master")
    writer.begin(0, "master")
    with pytest.raises(ReplicationError, match="contiguous"):
        writer.write(100, b"x" * 200)
    with pytest.raises(ReplicationError, match="not a record"):
        writer.write(0, b"\x00\x00\x01\x00" + b"\x12" * 300)
    assert slave.segments.max_offset == 0


def test_tail_range_stays_in_one_segment() -> None:
    assert tail_range(0, SEGMENT_BYTES) == 0
    assert tail_range(100, SEGMENT_BYTES) == 0
    assert tail_range(SEGMENT_BYTES + 10, SEGMENT_BYTES) == SEGMENT_BYTES
    assert tail_range(SEGMENT_BYTES, SEGMENT_BYTES) == SEGMENT_BYTES - 4096

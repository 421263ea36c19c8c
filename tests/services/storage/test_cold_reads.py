"""Reads of commitlog bytes that are not in memory (services/storage/cold_reads.py): a
real storage process, its segment's pages taken out of memory from outside
(tests/_smaps.py ``evict``), then read through Read (spans, positions), Tail and a new
slave's Replicate. The
answers are the stored bytes; ``tide_storage_cold_reads_total`` counts the reads that
went to the cold readers' threads, and only those (a read of bytes in memory stays on
the event loop)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._metrics import scrape, total
from tests._smaps import evict, resident_pages
from tests.services.storage.conftest import (
    StorageLauncher,
    StorageProcess,
    message,
    segment_files,
)
from tests.services.storage.test_read_spans import read_spans, span_of, stored_bytes
from tests.services.storage.test_replication import (
    assert_same_commitlog,
    produce,
    start_master,
    start_slave,
    wait_caught_up,
)
from tests.services.storage.test_service import tail_until
from tide.v1 import storage_pb2 as pb

RECORDS = 64
BODY_BYTES = 4000  # ~64 pages of records in all


@pytest.fixture
def storage(launcher: StorageLauncher, tmp_path: Path) -> Iterator[StorageProcess]:
    # Sync flush: every answered record is written back, so its pages can be evicted
    # (dirty pages cannot). No warm-up: the segment's pages past the records are never in
    # memory, dirty or not.
    process = launcher.start(
        tmp_path / "store",
        "--flush",
        "sync",
        "--no-warm-segments",
        "--metrics-listen",
        "127.0.0.1:0",
    )
    yield process
    process.stop()


def cold_reads(storage: StorageProcess) -> float:
    return total(scrape(str(storage.ready["metrics"])), "tide_storage_cold_reads_total")


def fill(storage: StorageProcess) -> list[pb.AppendResult]:
    return storage.append([message("Cold", 0, bytes([i]) * BODY_BYTES) for i in range(RECORDS)])


def make_cold(storage: StorageProcess, offset: int, size: int) -> None:
    segment = segment_files(storage.store_dir)[0]
    evict(storage.proc.pid, segment)
    assert resident_pages(segment, offset, size) == 0


def test_a_spans_read_of_bytes_not_in_memory_is_a_cold_read(storage: StorageProcess) -> None:
    span = span_of(fill(storage))
    offset, size, _ = span
    hot = read_spans(storage, span)  # just written, in memory: read on the loop
    assert cold_reads(storage) == 0
    make_cold(storage, offset, size)

    response = read_spans(storage, span)
    assert list(response.span_statuses) == [pb.FOUND]
    assert response.records == stored_bytes(storage.store_dir, offset, size) == hot.records
    assert cold_reads(storage) == 1
    # Read through the file, the pages are in the page cache now: the same read stays
    # on the loop.
    assert resident_pages(segment_files(storage.store_dir)[0], offset, size) > 0
    assert read_spans(storage, span).records == response.records
    assert cold_reads(storage) == 1


def test_a_positions_read_of_bytes_not_in_memory_is_a_cold_read(storage: StorageProcess) -> None:
    results = fill(storage)
    first, last = results[0], results[-1]
    make_cold(storage, first.physical_offset, last.physical_offset + last.size)

    found = storage.read([(r.physical_offset, r.size) for r in results])
    assert [f.status for f in found] == [pb.FOUND] * RECORDS
    assert [f.message.body for f in found] == [bytes([i]) * BODY_BYTES for i in range(RECORDS)]
    assert cold_reads(storage) == 1
    # A position without its size (read as big as its record says) too.
    make_cold(storage, last.physical_offset, last.size)
    (unsized,) = storage.read([(last.physical_offset, 0)])
    assert unsized.status == pb.FOUND and unsized.message.body == found[-1].message.body
    assert cold_reads(storage) == 2


def test_a_tail_behind_by_more_than_a_chunk_reads_cold_chunks_off_the_loop(
    storage: StorageProcess,
) -> None:
    results = fill(storage)
    end = results[-1].physical_offset + results[-1].size
    chunk_bytes = 16 * 1024  # the follower starts ~16 chunks behind
    make_cold(storage, 0, end)

    chunks = tail_until(storage, 0, end, max_chunk_bytes=chunk_bytes)
    assert b"".join(c.data for c in chunks)[:end] == stored_bytes(storage.store_dir, 0, end)
    # The first chunk was read cold; the disk's read-ahead may have brought the next ones
    # into memory, which are then read on the loop.
    behind = [c for c in chunks if end - c.offset > chunk_bytes]
    assert 1 <= cold_reads(storage) <= len(behind)


def test_a_new_slave_copies_a_master_whose_bytes_are_not_in_memory(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    master = start_master(
        launcher,
        tmp_path / "master",
        "--flush",
        "sync",
        "--no-warm-segments",
        "--ha-batch-bytes",
        str(16 * 1024),
        "--metrics-listen",
        "127.0.0.1:0",
    )
    end = produce(master, 40)[-1]
    make_cold(master, 0, end.physical_offset + end.size)

    slave = start_slave(launcher, tmp_path / "slave", master.listen)
    wait_caught_up(master, slave)
    assert_same_commitlog(tmp_path / "master", tmp_path / "slave")
    assert cold_reads(master) >= 1

"""Consume-queue entries that are not in memory (services/dispatch/cold_entries.py): a
real storage and dispatch, a queue's first segment taken out of memory from outside
(tests/_smaps.py ``evict``), then read far behind the queue's end by GetQueueEntries, a
POP receive and a delay level's delivery. The answers are what was read while the
entries were in memory; ``tide_dispatch_cold_reads_total`` counts the reads whose
entries a cold reader's thread brought in, and only those: entries in memory, and reads
near the end, stay on the event loop unchecked. QueryIndex's reader threads read the key
index and the consume queues through the files (pread), not through faults of the
mappings."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from services.dispatch.arrivals import ArrivalHub
from services.dispatch.cold_entries import COLD_CHECK_BEHIND_ENTRIES
from services.dispatch.servicer import DispatchServicer, Running
from tests._metrics import scrape, total
from tests._smaps import evict, present_pages, resident_pages
from tests.services.dispatch.conftest import DispatchLauncher, DispatchProcess
from tests.services.dispatch.delivery.test_schedule import scheduled
from tests.services.storage.conftest import StorageLauncher, message
from tide.format import (
    ENTRY_BYTES,
    INDEX_ENTRY_BYTES,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    half_properties,
)
from tide.mapped import reads_through_file
from tide.v1 import dispatch_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

ENTRIES_PER_SEGMENT = 1_000  # conftest's --cq-entries-per-segment
BATCH = 500
TOPIC = "Cold"
# Every dispatch here: a metrics endpoint, and no cleanup pass during the test (a pass
# reads the first segment's last entry and searches the queues through the mappings, on
# the store's writer thread: it would bring evicted pages back before the read under
# test, or map them after it).
ARGS = ("--metrics-listen", "127.0.0.1:0", "--cleanup-interval-ms", "3600000")


@pytest.fixture
def dispatch(
    launchers: tuple[StorageLauncher, DispatchLauncher], tmp_path: Path
) -> Iterator[DispatchProcess]:
    """A queue about COLD_CHECK_BEHIND_ENTRIES + 2 segments long, dispatched and flushed (its
    pages written back, so they can be evicted)."""
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    process = dispatches.start(tmp_path / "dispatch", storage.listen, *ARGS)
    count = COLD_CHECK_BEHIND_ENTRIES + 2 * ENTRIES_PER_SEGMENT
    count -= count % BATCH
    for _ in range(count // BATCH):
        results = storage.append([message(TOPIC, 0, b"x") for _ in range(BATCH)])
    end = results[-1].physical_offset + results[-1].size
    wait_flushed(process, end)
    assert process.offsets(TOPIC).max_offset == count
    yield process
    process.stop()
    storage.stop()


def wait_flushed(dispatch: DispatchProcess, end: int) -> None:
    """Until the commitlog below ``end`` is dispatched and flushed: the pages of its
    consume queues and index written back (only clean pages can be evicted)."""
    dispatch.wait_dispatched(end)
    wait_until(
        lambda: dispatch.status().durable_offset >= end,
        "the dispatched offset flushed",
        20.0,
        state=dispatch.status,
    )


def cold_reads(dispatch: DispatchProcess) -> float:
    return total(scrape(str(dispatch.ready["metrics"])), "tide_dispatch_cold_reads_total")


def first_segment(dispatch: DispatchProcess) -> Path:
    return dispatch.store_dir / "consumequeue" / TOPIC / "0" / f"{0:020d}"


def make_cold(dispatch: DispatchProcess) -> None:
    segment = first_segment(dispatch)
    evict(dispatch.proc.pid, segment)
    assert resident_pages(segment, 0, ENTRIES_PER_SEGMENT * ENTRY_BYTES) == 0


def spans(dispatch: DispatchProcess, offset: int) -> pb.GetQueueEntriesResponse:
    request = pb.GetQueueEntriesRequest(
        topic=TOPIC, queue_id=0, offset=offset, max_count=32, spans=True
    )
    return dispatch.stub.GetQueueEntries(request, timeout=20)


def test_entries_far_behind_and_not_in_memory_are_brought_in_off_the_loop(
    dispatch: DispatchProcess,
) -> None:
    hot = spans(dispatch, 0), dispatch.entries(TOPIC, offset=100, max_count=32)
    assert cold_reads(dispatch) == 0  # in memory: no cold read
    make_cold(dispatch)

    assert spans(dispatch, 0) == hot[0]
    assert cold_reads(dispatch) == 1
    # Brought into the page cache: the same read stays on the loop.
    assert resident_pages(first_segment(dispatch), 0, 32 * ENTRY_BYTES) > 0
    assert spans(dispatch, 0) == hot[0]
    assert cold_reads(dispatch) == 1
    # Entries one by one (no spans) too.
    make_cold(dispatch)
    assert dispatch.entries(TOPIC, offset=100, max_count=32) == hot[1]
    assert cold_reads(dispatch) == 2


def test_entries_near_the_end_are_not_checked(dispatch: DispatchProcess) -> None:
    """A consumer keeping up reads what was written moments ago: its entries are read on
    the loop without a residency check, even when (here, forced) they are not in
    memory."""
    end = dispatch.offsets(TOPIC).max_offset
    offset = end - COLD_CHECK_BEHIND_ENTRIES + 1
    hot = spans(dispatch, offset)
    segment = dispatch.store_dir / "consumequeue" / TOPIC / "0"
    path = segment / f"{offset // ENTRIES_PER_SEGMENT * ENTRIES_PER_SEGMENT * ENTRY_BYTES:020d}"
    evict(dispatch.proc.pid, path)
    assert spans(dispatch, offset) == hot
    assert cold_reads(dispatch) == 0


def test_a_pop_far_behind_brings_its_entries_in_off_the_loop(dispatch: DispatchProcess) -> None:
    """A POP consumer new to the queue starts at its first message, 6,000 behind."""
    make_cold(dispatch)
    request = pb.PopMessagesRequest(
        consumer_group="G", topic=TOPIC, queue_ids=[0], max_messages=32,
        invisible_duration_ms=60_000,
    )  # fmt: skip
    popped = dispatch.stub.PopMessages(request, timeout=20).messages
    assert [p.message.queue_offset for p in popped] == list(range(32))
    assert cold_reads(dispatch) == 1


def test_a_delay_level_far_behind_brings_its_head_in_off_the_loop(
    launchers: tuple[StorageLauncher, DispatchLauncher], tmp_path: Path
) -> None:
    """A level of an hour: its head is read at each arrival (is it due?), far behind its
    queue's end once thousands wait."""
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    dispatch = dispatches.start(
        tmp_path / "dispatch",
        storage.listen,
        "--message-delay-level",
        "1s 1h",
        *ARGS,
    )
    waiting = COLD_CHECK_BEHIND_ENTRIES + ENTRIES_PER_SEGMENT
    for first in range(0, waiting, BATCH):
        results = storage.append([scheduled(2, n) for n in range(first, first + BATCH)])
    wait_flushed(dispatch, results[-1].physical_offset + results[-1].size)
    head = dispatch.store_dir / "consumequeue" / SCHEDULE_TOPIC / "1" / f"{0:020d}"
    evict(dispatch.proc.pid, head)
    assert resident_pages(head, 0, ENTRIES_PER_SEGMENT * ENTRY_BYTES) == 0

    storage.append([scheduled(2, waiting)])  # wakes the level: it reads its head again
    wait_until(lambda: cold_reads(dispatch) >= 1, "the head read by a cold reader", 20.0)
    assert resident_pages(head, 0, ENTRY_BYTES) == 1
    dispatch.stop()
    storage.stop()


def test_a_search_by_time_reads_the_queue_through_the_files(dispatch: DispatchProcess) -> None:
    """SearchOffset's probes are spread over the whole queue: its reader threads read
    them with pread, so a segment taken out of memory comes back into the page cache but
    not into the dispatch's page tables."""
    make_cold(dispatch)
    request = pb.SearchOffsetRequest(topic=TOPIC, queue_id=0, timestamp_ms=0)
    assert dispatch.stub.SearchOffset(request, timeout=20).offset == 0
    segment = first_segment(dispatch)
    assert resident_pages(segment, 0, ENTRY_BYTES) == 1  # the first probe's entry
    assert present_pages(dispatch.proc.pid, segment, 0, ENTRIES_PER_SEGMENT * ENTRY_BYTES) == 0


def test_ending_a_half_far_behind_brings_its_entry_in_off_the_loop(
    launchers: tuple[StorageLauncher, DispatchLauncher], tmp_path: Path
) -> None:
    """EndTransaction of the oldest of thousands of open halves reads its entry from the
    half queue's first segment, taken out of memory: a cold read, and the half's answer."""
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen, *ARGS)
    properties = half_properties({"UNIQ_KEY": "K"}, "Real", 0, "PG", "tx")
    halves = COLD_CHECK_BEHIND_ENTRIES + ENTRIES_PER_SEGMENT
    results: list[storage_pb.AppendResult] = []
    for _ in range(0, halves, BATCH):
        results += storage.append(
            [message(TRANS_HALF_TOPIC, 0, b"half", properties=properties)] * BATCH
        )
    end = results[-1].physical_offset + results[-1].size
    wait_flushed(dispatch, end)
    head = dispatch.store_dir / "consumequeue" / TRANS_HALF_TOPIC / "0" / f"{0:020d}"
    evict(dispatch.proc.pid, head)
    assert resident_pages(head, 0, ENTRY_BYTES) == 0

    request = pb.DispatchEndTransactionRequest(
        producer_group="PG",
        queue_offset=0,
        physical_offset=results[0].physical_offset,
        transaction_id="tx",
        commit=True,
    )
    answer = dispatch.stub.EndTransaction(request, timeout=20)
    assert (answer.topic, answer.queue_id) == ("Real", 0)  # its committed copy
    assert cold_reads(dispatch) == 1
    dispatch.stop()
    storage.stop()


def test_index_lookups_read_consume_queues_through_the_files() -> None:
    """The reader threads (QueryIndex's candidates located in their consume queues) read
    the queues with pread: the GIL is free while the disk answers."""
    servicer = DispatchServicer(lambda: cast(Running, None), ArrivalHub())
    try:
        assert asyncio.run(servicer._in_reader(reads_through_file))
        assert not reads_through_file()
    finally:
        asyncio.run(servicer.stop_readers())


def test_a_query_reads_an_index_file_not_in_memory_through_the_file(
    launchers: tuple[StorageLauncher, DispatchLauncher], tmp_path: Path
) -> None:
    """QueryIndex walks a key's chain on a reader thread with pread (the GIL free while
    the disk answers): of an index file taken out of memory, the page of the entry the
    walk reads comes into the page cache but not into the dispatch's page tables (no
    fault), and the hit is the message with the key."""
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    # More entries than conftest's 4,000, so the last ones lie past the first 64 KiB of
    # the file: a fault near its start (the header's, by anything) maps at most the 16
    # pages around it that are in memory (the kernel's fault-around), never those.
    dispatch = dispatches.start(
        tmp_path / "dispatch", storage.listen, "--index-max-entries", "20000", *ARGS
    )
    count = 4_000
    results: list[storage_pb.AppendResult] = []
    for first in range(0, count, BATCH):
        results += storage.append(
            [message("Keys", 0, b"x", keys=[f"k{n}"]) for n in range(first, first + BATCH)]
        )
    end = results[-1].physical_offset + results[-1].size
    wait_flushed(dispatch, end)
    (index_file,) = (dispatch.store_dir / "index").iterdir()
    size = index_file.stat().st_size
    evict(dispatch.proc.pid, index_file)
    assert resident_pages(index_file, 0, size) == 0
    entries_from = size - 20_000 * INDEX_ENTRY_BYTES  # the entries follow the slots
    last_entry = entries_from + count * INDEX_ENTRY_BYTES  # the newest: the chain's head
    assert last_entry > 64 * 1024
    entry = last_entry - INDEX_ENTRY_BYTES

    request = pb.QueryIndexRequest(topic="Keys", key=f"k{count - 1}", max_count=4)
    (hit,) = dispatch.stub.QueryIndex(request, timeout=20).hits
    assert hit.physical_offset == results[-1].physical_offset
    assert resident_pages(index_file, entry, INDEX_ENTRY_BYTES) == 1  # read from the disk
    assert present_pages(dispatch.proc.pid, index_file, entry, INDEX_ENTRY_BYTES) == 0
    dispatch.stop()
    storage.stop()

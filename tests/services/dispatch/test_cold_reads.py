"""Consume-queue entries that are not in memory (services/dispatch/servicer.py
``_page_in``): a real storage and dispatch, a queue's first segment taken out of memory
from outside (tests/_smaps.py ``evict``), then read by GetQueueEntries far behind the
queue's end. The answer is what was read while the entries were in memory;
``tide_dispatch_cold_reads_total`` counts the calls whose entries a cold reader's
thread brought in, and only those: entries in memory, and reads near the end, stay on
the event loop unchecked."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from services.dispatch.arrivals import ArrivalHub
from services.dispatch.servicer import COLD_CHECK_BEHIND_ENTRIES, DispatchServicer, Running
from tests._metrics import scrape, total
from tests._smaps import evict, resident_pages
from tests.services.dispatch.conftest import DispatchLauncher, DispatchProcess
from tests.services.storage.conftest import StorageLauncher, message
from tide.format import ENTRY_BYTES
from tide.mapped import reads_through_file
from tide.v1 import dispatch_pb2 as pb
from tide.waiting import wait_until

ENTRIES_PER_SEGMENT = 1_000  # conftest's --cq-entries-per-segment
BATCH = 500
TOPIC = "Cold"


@pytest.fixture
def dispatch(
    launchers: tuple[StorageLauncher, DispatchLauncher], tmp_path: Path
) -> Iterator[DispatchProcess]:
    """A queue about COLD_CHECK_BEHIND_ENTRIES + 2 segments long, dispatched and flushed (its
    pages written back, so they can be evicted)."""
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    process = dispatches.start(
        tmp_path / "dispatch", storage.listen, "--metrics-listen", "127.0.0.1:0"
    )
    count = COLD_CHECK_BEHIND_ENTRIES + 2 * ENTRIES_PER_SEGMENT
    count -= count % BATCH
    for _ in range(count // BATCH):
        results = storage.append([message(TOPIC, 0, b"x") for _ in range(BATCH)])
    end = results[-1].physical_offset + results[-1].size
    process.wait_dispatched(end)
    wait_until(
        lambda: process.status().durable_offset >= end,
        "the queue flushed",
        20.0,
        state=process.status,
    )
    assert process.offsets(TOPIC).max_offset == count
    yield process
    process.stop()
    storage.stop()


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


def test_index_lookups_read_consume_queues_through_the_files() -> None:
    """The reader threads (QueryIndex's candidates located in their consume queues) read
    the queues with pread: the GIL is free while the disk answers."""
    servicer = DispatchServicer(lambda: cast(Running, None), ArrivalHub())
    try:
        assert asyncio.run(servicer._in_reader(reads_through_file))
        assert not reads_through_file()
    finally:
        asyncio.run(servicer.stop_readers())

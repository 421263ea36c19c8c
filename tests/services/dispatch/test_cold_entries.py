"""``page_in`` (services/dispatch/cold_entries.py) on a real consume queue whose segment
is taken out of memory (tests/_smaps.py ``evict``): entries far behind the end and not
in memory are read by a cold reader's thread, and only those."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from services.dispatch.cold_entries import COLD_CHECK_BEHIND_ENTRIES, page_in
from services.dispatch.engine.consume_queue import ConsumeQueue
from tests._smaps import evict
from tide.format import ENTRY_BYTES
from tide.server import ColdReads

EPS = 1024  # 20 KiB segments


def _queue(root: Path, count: int) -> ConsumeQueue:
    queue = ConsumeQueue(root, "T", 0, EPS)
    queue.load()
    queue.recover()
    for n in range(count):
        assert queue.put(n, n * 100, 100, 0)
    assert queue.flush(0)  # clean pages: they can be taken out of memory
    return queue


def _segment(root: Path, start: int) -> Path:
    return root / "consumequeue" / "T" / "0" / f"{start * ENTRY_BYTES:020d}"


def _cold_reads_of(queue: ConsumeQueue, offset: int, count: int) -> int:
    async def run() -> int:
        cold = ColdReads()
        try:
            await page_in(cold, queue, offset, count)
            return cold.count
        finally:
            cold.close()

    return asyncio.run(run())


def test_entries_far_behind_are_read_off_the_loop_only_when_not_in_memory(
    tmp_path: Path,
) -> None:
    queue = _queue(tmp_path, COLD_CHECK_BEHIND_ENTRIES + 2 * EPS)
    assert _cold_reads_of(queue, 0, 32) == 0  # in memory
    evict(os.getpid(), _segment(tmp_path, 0))
    assert not queue.resident(0, 32)
    assert _cold_reads_of(queue, 0, 32) == 1
    assert queue.resident(0, 32)  # read with pread: in the page cache now
    assert _cold_reads_of(queue, 0, 32) == 0
    queue.close()


def test_entries_near_the_end_below_the_min_or_none_are_not_checked(tmp_path: Path) -> None:
    count = COLD_CHECK_BEHIND_ENTRIES + 2 * EPS
    queue = _queue(tmp_path, count)
    near = count - COLD_CHECK_BEHIND_ENTRIES + 1
    for start in (0, near // EPS * EPS):
        evict(os.getpid(), _segment(tmp_path, start))
    assert not queue.resident(near, 32)
    assert _cold_reads_of(queue, near, 32) == 0  # written moments ago, for a real reader
    assert _cold_reads_of(queue, 0, 0) == 0
    queue.delete_below(EPS * 100 + 100)  # the first segment goes: the min is past 0
    assert queue.min_offset > 0
    assert _cold_reads_of(queue, 0, 32) == 0
    queue.close()

"""The timer's files (services/dispatch/delivery/timer_files.py) and their store
(timer_store.py): units and slots as docs/formats.md lays them out, chains, segments,
recovery after a cut, and a memory that does not grow with the timers filed."""

from __future__ import annotations

import asyncio
import os
import tracemalloc
from pathlib import Path
from typing import cast

import pytest

from services.dispatch.delivery.reput import Reput
from services.dispatch.delivery.timer_dequeue import Dequeuer
from services.dispatch.delivery.timer_files import TimerFileError, TimerLog, TimerWheel
from services.dispatch.delivery.timer_recovery import read_checkpoint
from services.dispatch.delivery.timer_store import (
    CHAIN_BATCH_UNITS,
    TimerSettings,
    TimerStore,
    is_roll,
)
from services.dispatch.storage_client import StorageClient
from tests._smaps import evict, present_pages, resident_pages
from tide.format import (
    TIMER_LOG_BLANK_BYTES,
    TIMER_LOG_UNIT_BYTES,
    TimerLogUnit,
    TimerSlot,
    TimerWheelGeometry,
    pack_timer_unit,
)

GEOMETRY = TimerWheelGeometry(precision_ms=1000, slots_total=3600)  # a 230 KB wheel
T0 = 1_700_000_000_000


def _unit(prev_pos: int, offset: int, slot_ms: int = T0 + 5000) -> TimerLogUnit:
    return TimerLogUnit(prev_pos, 1, T0, slot_ms - T0, offset, 100, 7)


def _store(root: Path, *, roll_window_slots: int = 600, segment_bytes: int = 1 << 20) -> TimerStore:
    store = TimerStore(root, TimerSettings(GEOMETRY, roll_window_slots, segment_bytes))
    store.open(T0)
    return store


def test_wheel_chains_units_and_reads_another_lap_empty(tmp_path: Path) -> None:
    wheel = TimerWheel(tmp_path / "timerwheel", GEOMETRY)
    assert wheel.add_unit(T0, 0) == TimerSlot(T0, 0, 0, 1)
    assert wheel.add_unit(T0, 52) == TimerSlot(T0, 0, 52, 2)
    assert wheel.slot(T0 + GEOMETRY.wheel_slots * 1000).last_pos == -1  # the next lap
    assert [s.time_ms for s in wheel.live_slots(T0)] == [T0]
    wheel.close()
    assert (tmp_path / "timerwheel").stat().st_size == GEOMETRY.file_bytes
    with pytest.raises(TimerFileError, match="slots need"):
        TimerWheel(tmp_path / "timerwheel", TimerWheelGeometry(1000, 7200))


def test_log_units_are_the_documented_bytes_and_cross_segments(tmp_path: Path) -> None:
    segment = 3 * TIMER_LOG_UNIT_BYTES + TIMER_LOG_BLANK_BYTES + 10  # 3 units, then a blank
    log = TimerLog(tmp_path / "timerlog", segment)
    offsets = [log.append(_unit(-1, 1000 * i)) for i in range(5)]
    assert offsets == [0, 52, 104, segment, segment + 52]  # 156: the blank
    assert log.segment_count == 2
    first = (tmp_path / "timerlog" / f"{0:020d}").read_bytes()
    assert first[:52] == pack_timer_unit(_unit(-1, 0))
    assert first[156 + 12 : 156 + 16] == bytes.fromhex("CBD43194")  # the blank's magic
    assert log.read(segment + 52).commitlog_offset == 4000
    scan = log.scan(log.end)
    assert scan is not None and scan.units == 2
    log.close()


def test_store_files_walks_and_rolls(tmp_path: Path) -> None:
    store = _store(tmp_path, roll_window_slots=60)
    store.file(0, 100, T0 + 5000, 1)
    store.file(100, 100, T0 + 5000, 1)
    far = store.file(200, 100, T0 + 3_000_000, 1)  # past the 60-slot window
    assert far == T0 + 60_000  # the window's end (beyond a third of a window past it)
    assert [u.commitlog_offset for b in store.chain(T0 + 5000) for u in b] == [100, 0]
    assert [is_roll(u) for b in store.chain(far) for u in b] == [True]
    store.firing = True  # a unit filed while the next slot fires goes after it
    assert store.file(300, 100, T0 - 50_000, 1) == T0 + 1000
    assert store.pending == 4
    store.close()


def test_recovery_cuts_at_the_checkpoint_and_relinks_slots(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for i in range(3):
        store.file(i * 100, 100, T0 + 5000, 1)
    store.queue_offset = 3
    store.save(store.snapshot())
    for i in range(3, 6):  # after the checkpoint: cut by recovery, filed again from the queue
        store.file(i * 100, 100, T0 + 5000, 1)
    store.file(600, 100, T0 + 9000, 1)
    store.close()
    checkpoint = read_checkpoint(store.checkpoint_path)
    assert checkpoint is not None and checkpoint.last_timer_log_flush_pos == 3 * 52

    again = TimerStore(tmp_path, store.settings)
    recovered = again.open(T0 + 100_000)  # the checkpoint's read time, not this clock
    assert (recovered.log_end, recovered.queue_offset, recovered.read_time_ms) == (156, 3, T0)
    assert recovered.relinked_slots == 2
    assert [u.commitlog_offset for b in again.chain(T0 + 5000) for u in b] == [200, 100, 0]
    assert again.wheel.slot(T0 + 9000).num == 0
    assert again.pending == 3
    again.file(700, 100, T0 + 5000, 1)  # the chain goes on from the kept units
    assert [u.commitlog_offset for b in again.chain(T0 + 5000) for u in b] == [700, 200, 100, 0]
    again.close()


def test_memory_does_not_grow_with_timers_filed(tmp_path: Path) -> None:
    """Nothing per timer is held in memory: filing 20,000 timers allocates a small,
    constant amount (each would cost ~100+ bytes if held), and a slot is walked in
    bounded batches."""
    store = _store(tmp_path, segment_bytes=4 << 20)
    store.file(0, 100, T0 + 2000, 1)  # warm up the code paths once
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(20_000):
            store.file(i * 100, 100, T0 + 2000 + (i % 50) * 1000, 1)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 200_000, f"{grown} bytes held after filing 20,000 timers"
    batches = [len(b) for b in store.chain(T0 + 2000)]
    assert sum(batches) == 401 and max(batches) == CHAIN_BATCH_UNITS
    store.close()


def test_segments_whose_slots_all_fired_are_deleted(tmp_path: Path) -> None:
    segment = 3 * TIMER_LOG_UNIT_BYTES + TIMER_LOG_BLANK_BYTES  # three units each
    store = _store(tmp_path, segment_bytes=segment)
    for i in range(7):  # slots T0+1s .. T0+7s over three segments
        store.file(i * 100, 100, T0 + 1000 * (i + 1), 1)
    assert store.timer_log.segment_count == 3
    assert store.timer_log.delete_fired(T0 + 3000) == 0  # the first holds slot T0+3s
    assert store.timer_log.delete_fired(T0 + 3001) == 1
    assert store.timer_log.delete_fired(T0 + 6000) == 0  # the second holds T0+6s
    assert store.timer_log.delete_fired(T0 + 6001) == 1
    assert store.timer_log.delete_fired(T0 + 60_000) == 0  # the one written to stays
    assert [u.commitlog_offset for b in store.chain(T0 + 7000) for u in b] == [600]
    store.close()
    reopened = TimerLog(tmp_path / "timerlog", segment)  # the latest slot read back on open
    assert reopened.segment_count == 1 and reopened.delete_fired(T0 + 60_000) == 0
    reopened.close()


def test_recovery_of_a_corrupt_unit_below_the_durable_position(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for i in range(4):
        store.file(i * 100, 100, T0 + 5000, 1)
    store.queue_offset = 4
    store.save(store.snapshot())
    store.close()
    segment = tmp_path / "timerlog" / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    data[2 * 52 : 2 * 52 + 4] = b"\x00\x00\x00\x07"  # the third unit's size
    segment.write_bytes(bytes(data))

    again = TimerStore(tmp_path, store.settings)
    recovered = again.open(T0)
    assert recovered.corrupt and recovered.log_end == 2 * 52
    assert [u.commitlog_offset for b in again.chain(T0 + 5000) for u in b] == [100, 0]
    again.close()


def test_a_slot_walked_by_the_dequeuer_reads_its_units_through_the_file(tmp_path: Path) -> None:
    """Dequeuer.chain_batches walks a slot's chain on its reader thread, which reads the
    log with pread: units taken out of memory come back into the page cache but not into
    this process's page tables (the GIL is free while the disk answers)."""
    store = _store(tmp_path)
    count = 3 * CHAIN_BATCH_UNITS  # units over several pages, walked in three batches
    for n in range(count):
        store.file(n * 100, 100, T0 + 5000, 1)
    store.timer_log.flush()  # written back: clean pages can be taken out of memory
    segment = tmp_path / "timerlog" / f"{0:020d}"
    size = count * TIMER_LOG_UNIT_BYTES
    evict(os.getpid(), segment)
    assert resident_pages(segment, 0, size) == 0
    dequeuer = Dequeuer(store, cast(StorageClient, None), cast(Reput, None))

    async def walk() -> list[list[TimerLogUnit]]:
        return [units async for units in dequeuer.chain_batches(T0 + 5000)]

    try:
        batches = asyncio.run(walk())
    finally:
        dequeuer.close()
    assert [len(b) for b in batches] == [CHAIN_BATCH_UNITS] * 3
    assert [u.commitlog_offset for b in batches for u in b] == [
        n * 100 for n in reversed(range(count))
    ]
    assert resident_pages(segment, 0, size) > 0
    assert present_pages(os.getpid(), segment, 0, size) == 0
    store.close()

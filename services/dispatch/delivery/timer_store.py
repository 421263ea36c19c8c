"""The timer's state on disk and its two positions: the wheel, the log, the checkpoint.

``queue_offset`` is the next timer-topic message to file (enqueue's), ``read_time_ms`` the
next slot to fire (dequeue's). Both run on the event loop; :meth:`TimerStore.file` never
awaits, so a unit and its slot are written together. While a slot is being fired
(``firing``), units are filed after it: the chain being walked never grows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.dispatch.delivery.timer_files import TimerLog, TimerWheel
from services.dispatch.delivery.timer_recovery import (
    Recovered,
    read_checkpoint,
    recover,
    write_checkpoint,
)
from tide.format import (
    DEFAULT_TIMER_LOG_SEGMENT_BYTES,
    TIMER_CHECKPOINT_FILE,
    TIMER_LOG_DIR,
    TIMER_MAGIC_DELETE,
    TIMER_MAGIC_ROLL,
    TIMER_WHEEL_FILE,
    TimerCheckpoint,
    TimerLogUnit,
    TimerWheelGeometry,
    plan_timer_enqueue,
    timer_magic,
)

log = logging.getLogger("tide.dispatch.timer")
CONFIG_DIR = "config"  # <store_dir>/config/timercheck, as the storage's config/
# Units walked in one step of a slot's chain (what is held while they are read and
# delivered): bounds the timer's memory whatever a slot holds.
CHAIN_BATCH_UNITS = 256


@dataclass(frozen=True, slots=True)
class TimerSettings:
    geometry: TimerWheelGeometry
    roll_window_slots: int
    log_segment_bytes: int = DEFAULT_TIMER_LOG_SEGMENT_BYTES


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a checkpoint records, taken on the event loop before the files are synced."""

    read_time_ms: int
    log_end: int
    queue_offset: int


class TimerStore:
    def __init__(self, store_dir: Path, settings: TimerSettings) -> None:
        self.settings = settings
        self.geometry = settings.geometry
        self.checkpoint_path = store_dir / CONFIG_DIR / TIMER_CHECKPOINT_FILE
        self._wheel_path = store_dir / TIMER_WHEEL_FILE
        self._log_dir = store_dir / TIMER_LOG_DIR
        self._wheel: TimerWheel | None = None
        self._log: TimerLog | None = None
        self.read_time_ms = 0
        self.queue_offset = 0
        self.pending = 0
        self.firing = False
        self.saved: Snapshot | None = None

    @property
    def wheel(self) -> TimerWheel:
        """The wheel, created on first use: a dispatch that never files a timer never
        reserves its 37 MiB."""
        if self._wheel is None:
            self._wheel = TimerWheel(self._wheel_path, self.geometry)
        return self._wheel

    def slot_units(self, slot_time_ms: int) -> int:
        """Units filed in the slot (0 without a wheel)."""
        return 0 if self._wheel is None else self._wheel.slot(slot_time_ms).num

    @property
    def timer_log(self) -> TimerLog:
        assert self._log is not None, "timer store not open"
        return self._log

    def open(self, now_ms: int) -> Recovered:
        """Open and recover the files (blocking: run it off the event loop)."""
        self._log = TimerLog(self._log_dir, self.settings.log_segment_bytes)
        checkpoint = read_checkpoint(self.checkpoint_path)
        if not self._wheel_path.exists() and not self._log.segment_count:
            # Nothing filed yet: nothing to recover, no wheel until the first timer is.
            read_time = checkpoint.last_read_time_ms if checkpoint else 0
            queue_offset = checkpoint.last_timer_queue_offset if checkpoint else 0
            read_time = read_time or self.geometry.slot_time_ms(now_ms)
            recovered = Recovered(0, read_time, queue_offset, 0, 0, corrupt=False, pending=0)
        else:
            recovered = recover(self.wheel, self._log, checkpoint, now_ms)
        self.read_time_ms = recovered.read_time_ms
        self.queue_offset = recovered.queue_offset
        self.pending = recovered.pending
        self.saved = Snapshot(recovered.read_time_ms, recovered.log_end, recovered.queue_offset)
        return recovered

    def close(self) -> None:
        if self._wheel is not None:
            self._wheel.close()
        if self._log is not None:
            self._log.close()
        self._wheel = self._log = None

    # -- filing ------------------------------------------------------------------------
    def earliest_slot_ms(self) -> int:
        """The first slot a unit may go into now: the next to fire, or the one after it
        while that one is being fired."""
        return self.read_time_ms + (self.geometry.precision_ms if self.firing else 0)

    def file(
        self,
        commitlog_offset: int,
        commitlog_size: int,
        slot_time_ms: int,
        topic_hash: int,
        *,
        delete: bool = False,
    ) -> int:
        """File a unit for the message at ``(commitlog_offset, commitlog_size)`` due in
        the slot of ``slot_time_ms`` (a slot already fired: the next to fire). The slot
        it went into (the roll window's end for a far one)."""
        target = max(self.geometry.slot_time_ms(slot_time_ms), self.earliest_slot_ms())
        write_time = self.earliest_slot_ms()
        plan = plan_timer_enqueue(
            self.geometry, target, write_time, self.settings.roll_window_slots
        )
        wheel = self.wheel
        previous = wheel.slot(plan.slot_time_ms).last_pos
        unit = TimerLogUnit(
            prev_pos=previous,
            magic=timer_magic(roll=plan.roll, delete=delete),
            enqueue_time_ms=write_time,
            delay_ms=plan.slot_time_ms - write_time,
            commitlog_offset=commitlog_offset,
            commitlog_size=commitlog_size,
            topic_hash=topic_hash,
        )
        wheel.add_unit(plan.slot_time_ms, self.timer_log.append(unit))
        if not delete:
            self.pending += 1
        return plan.slot_time_ms

    def chain(self, slot_time_ms: int) -> Iterator[list[TimerLogUnit]]:
        """The units of a slot, newest first, ``CHAIN_BATCH_UNITS`` at a time."""
        if self._wheel is None:
            return
        slot = self._wheel.slot(slot_time_ms)
        position, left = slot.last_pos, slot.num
        batch: list[TimerLogUnit] = []
        # ``num`` bounds the walk too: a chain never loops (prev_pos points back), and a
        # cut log never leaves a slot naming units it lost (recovery relinks those).
        while position >= 0 and left > 0:
            unit = self.timer_log.read(position)
            batch.append(unit)
            left -= 1
            position = unit.prev_pos
            if len(batch) >= CHAIN_BATCH_UNITS:
                yield batch
                batch = []
        if batch:
            yield batch

    # -- progress ------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return Snapshot(self.read_time_ms, self.timer_log.end, self.queue_offset)

    def save(self, snapshot: Snapshot) -> TimerCheckpoint:
        """Sync the log, then the wheel, then record ``snapshot`` (blocking: off the loop).
        A snapshot is taken before the sync: everything it counts is on disk after it."""
        self.timer_log.flush()
        if self._wheel is not None:
            self._wheel.flush()
        checkpoint = TimerCheckpoint(
            last_read_time_ms=snapshot.read_time_ms,
            last_timer_log_flush_pos=snapshot.log_end,
            last_timer_queue_offset=snapshot.queue_offset,
            master_timer_queue_offset=snapshot.queue_offset,
        )
        write_checkpoint(self.checkpoint_path, checkpoint)
        self.saved = snapshot
        return checkpoint


def is_roll(unit: TimerLogUnit) -> bool:
    return bool(unit.magic & TIMER_MAGIC_ROLL)


def is_delete(unit: TimerLogUnit) -> bool:
    return bool(unit.magic & TIMER_MAGIC_DELETE)

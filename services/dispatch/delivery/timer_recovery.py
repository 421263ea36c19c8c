"""The timer's checkpoint file and its recovery (RocketMQ 5's ``TimerCheckpoint`` and
``TimerMessageStore.recover``), on the layouts of tide.format (docs/formats.md, "Timer
checkpoint", "Timer log: torn tails and corruption", "Timer wheel: what recovery finds").

The checkpoint is one consistent snapshot, taken after the log and the wheel were synced:
``last_timer_log_flush_pos`` (every unit below it is on disk), ``last_timer_queue_offset``
(every timer-topic message below it has its unit below that position) and
``last_read_time_ms`` (every slot before it was delivered). Recovery therefore cuts the log
at the durable position (what was filed after it is filed again from the timer topic's
queue), relinks the slots that named cut units, and starts the wheel at the recorded read
time (what was delivered after it is delivered again: at-least-once).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from services.dispatch.delivery.timer_files import TimerLog, TimerWheel
from tide.format import (
    TIMER_CHECKPOINT_FILE_BYTES,
    TIMER_LOG_UNIT_BYTES,
    TimerCheckpoint,
    TimerLogEnd,
    TimerSlot,
)

log = logging.getLogger("tide.dispatch.timer")
NO_POS = -1  # TimerWheel.BLANK: an emptied slot


def read_checkpoint(path: Path) -> TimerCheckpoint | None:
    """The checkpoint file's content, None when there is none (a new timer)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return TimerCheckpoint.unpack(data)


def write_checkpoint(path: Path, checkpoint: TimerCheckpoint) -> None:
    """Replace the checkpoint durably: a new file, synced, renamed over the old one (a
    crash leaves the old or the new, never a torn page)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = checkpoint.pack_file()
    assert len(data) == TIMER_CHECKPOINT_FILE_BYTES
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@dataclass(frozen=True, slots=True)
class Recovered:
    log_end: int  # where the next unit goes
    read_time_ms: int  # the first slot not delivered yet
    queue_offset: int  # the next timer-topic queue offset to file
    cut_bytes: int  # log bytes past the durable position dropped (filed again)
    relinked_slots: int  # slots that named cut units, rebuilt from the kept ones
    corrupt: bool  # units below the durable position were invalid (the queue offset
    # must then be revised from the last unit kept: ``reviseQueueOffset``)
    pending: int  # units filed in the slots from read_time_ms on (one lap)


def recover(
    wheel: TimerWheel, timer_log: TimerLog, checkpoint: TimerCheckpoint | None, now_ms: int
) -> Recovered:
    """Check and repair the files against ``checkpoint`` (None: a new timer)."""
    cp = checkpoint or TimerCheckpoint()
    durable = cp.last_timer_log_flush_pos
    read_time_ms = cp.last_read_time_ms or wheel.geometry.slot_time_ms(now_ms)
    scan = timer_log.scan(durable)
    corrupt = False
    if scan is None or (scan.end_offset < durable and scan.ending is not TimerLogEnd.CORRUPT):
        # Flushed units are missing (files removed): file the timer topic again from the
        # last unit kept, or from its start.
        end = scan.end_offset if scan else 0
        corrupt = durable > end
        if corrupt:
            log.error("timer log: ends at %d, the checkpoint says %d was flushed", end, durable)
    elif scan.ending is TimerLogEnd.CORRUPT:
        log.error(
            "timer log: flushed unit at %d is invalid (%s); the log is cut there and the "
            "timer topic is filed again from the message of the last unit kept",
            scan.end_offset,
            scan.reason,
        )
        end, corrupt = scan.end_offset, True
    else:
        # Units past the durable position may be whole, but the checkpoint's queue
        # offset is that of the durable position: they are filed again from there.
        end = durable
    found_end = scan.end_offset if scan else 0
    timer_log.truncate(end)
    relinked = _relink(wheel, timer_log, read_time_ms, end)
    pending = count_pending(wheel, read_time_ms)
    return Recovered(
        log_end=end,
        read_time_ms=read_time_ms,
        queue_offset=cp.last_timer_queue_offset,
        cut_bytes=max(0, found_end - end),
        relinked_slots=relinked,
        corrupt=corrupt,
        pending=pending,
    )


def _relink(wheel: TimerWheel, timer_log: TimerLog, read_time_ms: int, end: int) -> int:
    """Rebuild the slots (from ``read_time_ms`` on) whose last unit is at or past ``end``
    (RocketMQ's ``checkPhyPos``, which then files the log again from there).

    Every unit of such a slot is at or past its ``first_pos``, so the kept ones are all in
    ``[first_pos, end)``; their ``prev_pos`` chain is intact (it only points back).
    """
    broken = {
        slot.time_ms: slot.first_pos
        for slot in wheel.live_slots(read_time_ms)
        if slot.last_pos >= end
    }  # bounded: the slots written since the last checkpoint
    if not broken:
        return 0
    rebuilt: dict[int, TimerSlot] = {}
    for offset in range(min(broken.values()), end, TIMER_LOG_UNIT_BYTES):
        unit = timer_log.read_checked(offset)
        if unit is None or unit.delayed_time_ms not in broken:
            continue  # a segment's blank, or a unit of a slot that is whole
        old = rebuilt.get(unit.delayed_time_ms)
        first = offset if old is None else old.first_pos
        rebuilt[unit.delayed_time_ms] = TimerSlot(
            unit.delayed_time_ms, first, offset, 1 if old is None else old.num + 1
        )
    for time_ms in broken:
        wheel.put(rebuilt.get(time_ms) or TimerSlot(time_ms, NO_POS, NO_POS, 0))
    log.info(
        "timer wheel: %d slot(s) named units past the log's end %d; relinked", len(broken), end
    )
    return len(broken)


def count_pending(wheel: TimerWheel, read_time_ms: int) -> int:
    """Units filed in the slots from ``read_time_ms`` on, one lap (the pending gauge's
    start; ROLL and DELETE units counted too)."""
    return sum(slot.num for slot in wheel.live_slots(read_time_ms))

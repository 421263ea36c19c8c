"""The timer wheel: RocketMQ 5's ``timerwheel`` file, and where a timed message is filed.

docs/formats.md, "Timer wheel". One file of ``2 * slots_total`` slots of 32 bytes, where
``slots_total = 7 days * 86400`` whatever the precision (``TimerMessageStore``:
``TIMER_WHEEL_TTL_DAY * DAY_SECS``), so 38,707,200 bytes. A slot, big-endian
(``TimerWheel.putSlot``)::

    time:i64 (time_ms // precision_ms)  first_pos:i64  last_pos:i64  num:i32  magic:i32

Time ``t`` (ms) lives in slot ``(t // precision_ms) % (2 * slots_total)``. A slot whose
stored time is not the asked one belongs to another lap of the wheel: it reads as empty
(``TimerWheel.getSlot``). ``first_pos`` / ``last_pos`` are timer-log offsets of the slot's
first and last unit; ``num`` counts its units (a recall subtracts one); ``magic`` is kept
as RocketMQ keeps it (unused, 0).

Enqueue (``HookUtils.transformTimerMessage``, ``TimerMessageStore.doEnqueue``): a delivery
time is rounded down to the precision, one step less when it is exactly on a boundary, and
the slot fires once its whole period is past, so a message never fires early. A time
beyond the roll window (default 2 days) is filed at the window's end (or half of it) with
the ROLL bit, and filed again from there when that slot fires.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from tide.format._consume_queue import WritableBuffer
from tide.format._record import Buffer

TIMER_SLOT_BYTES = 32  # Slot.SIZE
DAY_SECS = 24 * 3600
TIMER_WHEEL_TTL_DAYS = 7  # TimerMessageStore.TIMER_WHEEL_TTL_DAY
TIMER_WHEEL_SLOTS_TOTAL = TIMER_WHEEL_TTL_DAYS * DAY_SECS  # 604,800; the file has twice that
TIMER_BLANK_SLOTS = 60  # TimerMessageStore.TIMER_BLANK_SLOTS
ROCKETMQ_TIMER_PRECISION_MS = 1000  # MessageStoreConfig.timerPrecisionMs's default
# Tide's default (the dispatch's --timer-precision-ms, a wheel's): half RocketMQ's. A slot
# fires once its whole period is over, so lateness is spread over one period plus the
# slot's work: at 1000 ms its p99 cannot be under the 1 s target, at 500 ms the
# benchmark measured ~0.5 s (docs/delivery.md, "Timed messages"; docs/benchmarks.md).
DEFAULT_TIMER_PRECISION_MS = 500
TIMER_PRECISIONS_MS = (100, 200, 500, 1000)  # MessageStoreConfig.setTimerPrecisionMs
DEFAULT_TIMER_ROLL_WINDOW_SLOTS = 2 * DAY_SECS  # timerRollWindowSlot
DEFAULT_TIMER_MAX_DELAY_S = 3 * DAY_SECS  # timerMaxDelaySec: farthest a timed message may be
TIMER_WHEEL_FILE = "timerwheel"
NO_POS = -1  # TimerWheel.BLANK

_SLOT = struct.Struct(">qqqii")
assert _SLOT.size == TIMER_SLOT_BYTES


def iter_timer_slots(buf: Buffer) -> Iterator[tuple[int, int, int, int, int]]:
    """(time in precision units, first_pos, last_pos, num, magic) of each slot of a
    wheel file's bytes, in file order, unpacked in C (recovery reads them all)."""
    return _SLOT.iter_unpack(buf)


class TimerSlot(NamedTuple):
    time_ms: int  # the slot's time (stored / precision_ms), -1 for an empty slot
    first_pos: int
    last_pos: int
    num: int = 0
    magic: int = 0


EMPTY_SLOT = TimerSlot(NO_POS, NO_POS, NO_POS)


@dataclass(frozen=True, slots=True)
class TimerWheelGeometry:
    """Precision and slot count of a wheel (``slots_total`` is fixed in RocketMQ; tests
    use small ones)."""

    precision_ms: int = DEFAULT_TIMER_PRECISION_MS
    slots_total: int = TIMER_WHEEL_SLOTS_TOTAL

    def __post_init__(self) -> None:
        if self.precision_ms not in TIMER_PRECISIONS_MS:
            raise ValueError(
                f"timer precision {self.precision_ms} ms; it must be one of "
                f"{', '.join(map(str, TIMER_PRECISIONS_MS))} ms"
            )
        if self.slots_total <= TIMER_BLANK_SLOTS:
            raise ValueError(
                f"timer wheel of {self.slots_total} slots; it needs more than {TIMER_BLANK_SLOTS}"
            )

    @property
    def wheel_slots(self) -> int:
        return 2 * self.slots_total

    @property
    def file_bytes(self) -> int:
        return self.wheel_slots * TIMER_SLOT_BYTES

    def slot_index(self, time_ms: int) -> int:
        """``TimerWheel.getSlotIndex``."""
        return time_ms // self.precision_ms % self.wheel_slots

    def slot_position(self, time_ms: int) -> int:
        return self.slot_index(time_ms) * TIMER_SLOT_BYTES

    def slot_time_ms(self, time_ms: int) -> int:
        """The start of the period ``time_ms`` is in (``formatTimeMs``)."""
        return time_ms // self.precision_ms * self.precision_ms


def timer_precision_ms(configured_ms: int) -> int:
    """``MessageStoreConfig.setTimerPrecisionMs``: round down to 100, 200, 500 or 1000
    (anything below 200 is 100, anything from 1000 up is 1000)."""
    chosen = TIMER_PRECISIONS_MS[0]
    for candidate in TIMER_PRECISIONS_MS:
        if configured_ms >= candidate:
            chosen = candidate
    return chosen


def timer_roll_window_slots(configured: int, slots_total: int = TIMER_WHEEL_SLOTS_TOTAL) -> int:
    """The roll window RocketMQ uses for a configured ``timerRollWindowSlot``."""
    if configured > slots_total - TIMER_BLANK_SLOTS or configured < 2:
        return slots_total - TIMER_BLANK_SLOTS
    return configured


def pack_slot(geometry: TimerWheelGeometry, slot: TimerSlot) -> bytes:
    return _SLOT.pack(slot.time_ms // geometry.precision_ms, *slot[1:])


def unpack_slot(geometry: TimerWheelGeometry, buf: Buffer, pos: int = 0) -> TimerSlot:
    """The slot at ``pos`` as stored (``TimerWheel.getRawSlot``)."""
    stored, first_pos, last_pos, num, magic = _SLOT.unpack_from(buf, pos)
    return TimerSlot(stored * geometry.precision_ms, first_pos, last_pos, num, magic)


def read_wheel_slot(geometry: TimerWheelGeometry, buf: Buffer, time_ms: int) -> TimerSlot:
    """The slot of ``time_ms``, or :data:`EMPTY_SLOT` when it holds another lap's time."""
    slot = unpack_slot(geometry, buf, geometry.slot_position(time_ms))
    return slot if slot.time_ms == geometry.slot_time_ms(time_ms) else EMPTY_SLOT


def put_wheel_slot(geometry: TimerWheelGeometry, buf: WritableBuffer, slot: TimerSlot) -> None:
    """Write ``slot`` where its time lives (the whole 32 bytes)."""
    _SLOT.pack_into(
        buf,
        geometry.slot_position(slot.time_ms),
        slot.time_ms // geometry.precision_ms,
        *slot[1:],
    )


def wheel_file_error(geometry: TimerWheelGeometry, file_bytes: int) -> str | None:
    """Why a wheel file of ``file_bytes`` cannot be opened with ``geometry`` (RocketMQ
    refuses any length but 0, a new file, and the expected one)."""
    if file_bytes in (0, geometry.file_bytes):
        return None
    return (
        f"timer wheel file is {file_bytes} bytes; {geometry.slots_total} slots need "
        f"{geometry.file_bytes} (was it written with another slot count?)"
    )


def first_pos_past(
    geometry: TimerWheelGeometry, buf: Buffer, start_ms: int, log_end: int
) -> int | None:
    """``TimerWheel.checkPhyPos``: the smallest ``first_pos`` of the slots from
    ``start_ms`` on (one lap) whose ``last_pos`` is at or past ``log_end``, or None.

    Recovery files the timer log again from there: those slots name units the (cut) log
    no longer has. RocketMQ tests ``last_pos > log_end``; a unit at ``log_end`` itself is
    past the log too, so Tide tests ``>=``.
    """
    found: int | None = None
    first_index = geometry.slot_index(start_ms)
    lap = geometry.wheel_slots
    step_units = start_ms // geometry.precision_ms
    slots = _SLOT.iter_unpack(memoryview(buf)[: geometry.file_bytes])
    for index, (stored, first_pos, last_pos, _num, _magic) in enumerate(slots):
        expected = step_units + (index - first_index) % lap
        if stored == expected and last_pos >= log_end:
            found = first_pos if found is None else min(found, first_pos)
    return found


def timer_slot_time_ms(geometry: TimerWheelGeometry, deliver_ms: int) -> int:
    """The slot time a delivery time is filed under (``HookUtils.transformTimerMessage``,
    stored as ``TIMER_OUT_MS``): rounded down to the precision, one step less on a boundary.
    The slot fires once its period is over, at or after ``deliver_ms``."""
    if deliver_ms % geometry.precision_ms == 0:
        return deliver_ms - geometry.precision_ms
    return geometry.slot_time_ms(deliver_ms)


class TimerEnqueue(NamedTuple):
    slot_time_ms: int  # the slot the unit goes into
    roll: bool  # filed at the window's end, to be filed again from there


def plan_timer_enqueue(
    geometry: TimerWheelGeometry, delayed_ms: int, write_time_ms: int, roll_window_slots: int
) -> TimerEnqueue:
    """``TimerMessageStore.doEnqueue``: where a unit for ``delayed_ms`` goes when the wheel's
    write time is ``write_time_ms``."""
    window_ms = roll_window_slots * geometry.precision_ms
    if delayed_ms - write_time_ms < window_ms:
        return TimerEnqueue(delayed_ms, roll=False)
    # Just past the window: file at half of it, so the next roll still has time to spare.
    if delayed_ms - write_time_ms - window_ms < roll_window_slots // 3 * geometry.precision_ms:
        return TimerEnqueue(write_time_ms + roll_window_slots // 2 * geometry.precision_ms, True)
    return TimerEnqueue(write_time_ms + window_ms, roll=True)


def timer_deliver_error(deliver_ms: int, now_ms: int, max_delay_s: int) -> str | None:
    """Why a timed message for ``deliver_ms`` is refused at ``now_ms``, or None.

    A time in the past is accepted (delivered now); one more than ``max_delay_s`` ahead is
    refused, as RocketMQ's ``WHEEL_TIMER_MSG_ILLEGAL``.
    """
    ahead_ms = deliver_ms - now_ms
    if ahead_ms > max_delay_s * 1000:
        return (
            f"deliver_at_ms {deliver_ms} is {ahead_ms} ms ahead; the maximum delay is "
            f"{max_delay_s} s (timerMaxDelaySec)"
        )
    return None

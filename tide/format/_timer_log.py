"""The timer log: RocketMQ 5's ``timerlog/``, an append-only chain of 52-byte units.

docs/formats.md, "Timer log". Segments of ``mappedFileSizeTimerLog`` bytes (default
100 MiB) named by their 20-digit start offset, like commitlog segments. A unit, big-endian
(``TimerMessageStore.doEnqueue``)::

    size:i32 (52)  prev_pos:i64  magic:i32  enqueue_time_ms:i64  delay_ms:i32
    commitlog_offset:i64  commitlog_size:i32  topic_hash:i32  reserved:i64 (0)

``prev_pos`` is the timer-log offset of the previous unit filed under the same wheel slot
(-1 for the first), so a slot's units form a chain walked back from the slot's last
position. The unit fires at ``enqueue_time_ms + delay_ms``. ``topic_hash`` is Java's
``hashCode`` of the real topic (metrics only).

A unit goes into a segment while ``52 + 16 <= bytes_left``; otherwise the writer puts a
16-byte blank marker ``bytes_left:i32 0:i64 0xCBD43194:i32`` (the commitlog's blank magic,
at byte 12 where a unit's magic is) and continues at the next segment (``TimerLog.append``).
"""

from __future__ import annotations

import enum
import re
import struct
from collections.abc import Iterator
from typing import NamedTuple

from tide.format._record import BLANK_MAGIC, Buffer

TIMER_LOG_UNIT_BYTES = 52  # TimerLog.UNIT_SIZE
TIMER_LOG_BLANK_BYTES = 16  # TimerLog.MIN_BLANK_LEN
DEFAULT_TIMER_LOG_SEGMENT_BYTES = 100 * 1024 * 1024  # mappedFileSizeTimerLog
TIMER_LOG_DIR = "timerlog"
# Where the commitlog reference starts in a unit (TimerLog.UNIT_PRE_SIZE_FOR_MSG).
TIMER_UNIT_COMMITLOG_POS = 28
# Magic bits (TimerMessageStore.MAGIC_*): every unit has DEFAULT; ROLL marks a unit filed
# at the end of the roll window, to be filed again rather than delivered; DELETE a recall.
TIMER_MAGIC_DEFAULT = 1
TIMER_MAGIC_ROLL = 1 << 1
TIMER_MAGIC_DELETE = 1 << 2
_NON_ZERO = re.compile(rb"[^\x00]")  # searched in C, over an mmap without a copy
_MAGIC_BITS = 0xF  # TimerMessageStore.isMagicOK: no bit above these four
NO_PREV_POS = -1  # TimerWheel.BLANK: first unit of its slot

_UNIT = struct.Struct(">iqiqiqiiq")
_BLANK = struct.Struct(">iqi")
assert _UNIT.size == TIMER_LOG_UNIT_BYTES
assert _BLANK.size == TIMER_LOG_BLANK_BYTES
# A unit's size, enqueue time and delay alone (the last slot time of a segment).
_UNIT_TIMES = struct.Struct(">i8x4xqi24x")
assert _UNIT_TIMES.size == TIMER_LOG_UNIT_BYTES


class TimerLogUnit(NamedTuple):
    prev_pos: int
    magic: int
    enqueue_time_ms: int
    delay_ms: int  # signed: a message already due when filed has a negative delay
    commitlog_offset: int
    commitlog_size: int
    topic_hash: int
    reserved: int = 0

    @property
    def delayed_time_ms(self) -> int:
        """When the unit fires (the slot time it is filed under)."""
        return self.enqueue_time_ms + self.delay_ms


def timer_magic(roll: bool = False, delete: bool = False) -> int:
    return (
        TIMER_MAGIC_DEFAULT
        | (TIMER_MAGIC_ROLL if roll else 0)
        | (TIMER_MAGIC_DELETE if delete else 0)
    )


def timer_delete_key(real_topic: str, uniq_key: str) -> str:
    """A recall's ``TIMER_DEL_UNIQKEY`` value (``TimerMessageStore.buildDeleteKey``)."""
    return f"{real_topic}+{uniq_key}"


def pack_timer_unit(unit: TimerLogUnit) -> bytes:
    return _UNIT.pack(TIMER_LOG_UNIT_BYTES, *unit)


def unpack_timer_unit(buf: Buffer, pos: int = 0) -> TimerLogUnit:
    """The unit at ``pos`` as stored (no checks; see :func:`timer_unit_error`)."""
    _size, *fields = _UNIT.unpack_from(buf, pos)
    return TimerLogUnit(*fields)


def iter_unit_times(buf: Buffer) -> Iterator[tuple[int, int, int]]:
    """(size, enqueue time ms, delay ms) of each whole unit of ``buf``, unpacked in C;
    the caller stops at the first whose size is not TIMER_LOG_UNIT_BYTES (the blank)."""
    return _UNIT_TIMES.iter_unpack(buf)


def pack_timer_blank(bytes_left: int) -> bytes:
    """The blank marker that ends a segment with ``bytes_left`` bytes unused."""
    assert bytes_left >= TIMER_LOG_BLANK_BYTES, bytes_left
    return _BLANK.pack(bytes_left, 0, BLANK_MAGIC)


def timer_unit_fits(bytes_left: int) -> bool:
    """``TimerLog.append``: a unit goes in while a blank marker still fits after it."""
    return bytes_left >= TIMER_LOG_UNIT_BYTES + TIMER_LOG_BLANK_BYTES


def last_unit_position(segment_bytes: int) -> int:
    """``TimerLog.getOffsetForLastUnit``: where the last unit of a full segment starts."""
    usable = segment_bytes - TIMER_LOG_BLANK_BYTES
    return usable - usable % TIMER_LOG_UNIT_BYTES - TIMER_LOG_UNIT_BYTES


def timer_unit_error(buf: Buffer, pos: int, unit_offset: int) -> str | None:
    """Why the bytes at ``pos`` (timer-log offset ``unit_offset``) are not a unit, or None.

    RocketMQ's recovery checks ``size == 52`` and ``isMagicOK``; Tide also needs the
    DEFAULT bit (RocketMQ sets it on every unit, so zeros are never a unit), a chain that
    goes back (``-1 <= prev_pos < unit_offset``) and a commitlog reference that can exist.
    """
    if len(buf) - pos < TIMER_LOG_UNIT_BYTES:
        return f"only {len(buf) - pos} bytes left, a unit is {TIMER_LOG_UNIT_BYTES}"
    size = struct.unpack_from(">i", buf, pos)[0]
    if size != TIMER_LOG_UNIT_BYTES:
        return f"size {size}, not {TIMER_LOG_UNIT_BYTES}"
    unit = unpack_timer_unit(buf, pos)
    if unit.magic | _MAGIC_BITS != _MAGIC_BITS or not unit.magic & TIMER_MAGIC_DEFAULT:
        return f"magic {unit.magic:#x} is not DEFAULT (1) with only ROLL (2) and DELETE (4)"
    if not NO_PREV_POS <= unit.prev_pos < unit_offset:
        return f"prev_pos {unit.prev_pos} does not point back (unit at {unit_offset})"
    if unit.commitlog_offset < 0 or unit.commitlog_size <= 0:
        return f"commitlog reference ({unit.commitlog_offset}, {unit.commitlog_size}) is invalid"
    return None


def is_timer_blank(buf: Buffer, pos: int, segment_bytes: int) -> bool:
    """The blank marker, reaching exactly the segment's end, is at ``pos``."""
    if len(buf) - pos < TIMER_LOG_BLANK_BYTES:
        return False
    bytes_left: int
    zero: int
    magic: int
    bytes_left, zero, magic = _BLANK.unpack_from(buf, pos)
    return magic == BLANK_MAGIC and zero == 0 and bytes_left == segment_bytes - pos


class TimerLogEnd(enum.Enum):
    """How a scan of one segment ended (the verdict table of docs/formats.md)."""

    NEXT_SEGMENT = "next segment"  # a blank marker: continue at the next segment
    END = "end"  # zeros from here to the segment's end: nothing written yet
    TORN_TAIL = "torn tail"  # invalid bytes past the durable offset: cut here
    CORRUPT = "corrupt"  # invalid bytes (zeros too) below the durable offset


class TimerLogScan(NamedTuple):
    end_offset: int  # timer-log offset just past the last valid unit (or the blank's end)
    ending: TimerLogEnd
    units: int
    reason: str = ""  # why the bytes at end_offset are not a unit (TORN_TAIL, CORRUPT)


def scan_timer_log_segment(
    buf: Buffer, segment_start: int, durable_offset: int, segment_bytes: int | None = None
) -> TimerLogScan:
    """Check a segment's units from its start, as recovery does (``recoverAndRevise``).

    ``durable_offset`` is the timer checkpoint's ``lastTimerLogFlushPos``: every byte below
    it was flushed. Past it, invalid bytes are a torn tail: recovery cuts there, and the
    units after the cut are filed again from the timer topic's consume queue.
    """
    size = len(buf) if segment_bytes is None else segment_bytes
    pos, units = 0, 0
    while pos < size:
        if is_timer_blank(buf, pos, size):
            return TimerLogScan(segment_start + size, TimerLogEnd.NEXT_SEGMENT, units)
        error = timer_unit_error(buf, pos, segment_start + pos)
        if error is not None:
            return _stop(buf, segment_start, pos, durable_offset, units, error)
        pos += TIMER_LOG_UNIT_BYTES
        units += 1
    return TimerLogScan(segment_start + pos, TimerLogEnd.END, units)


def _stop(
    buf: Buffer, segment_start: int, pos: int, durable_offset: int, units: int, error: str
) -> TimerLogScan:
    offset = segment_start + pos
    if offset < durable_offset:
        return TimerLogScan(offset, TimerLogEnd.CORRUPT, units, error)
    if _NON_ZERO.search(buf, pos) is None:
        return TimerLogScan(offset, TimerLogEnd.END, units)
    return TimerLogScan(offset, TimerLogEnd.TORN_TAIL, units, error)

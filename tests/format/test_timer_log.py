"""The timer log: unit layout, blank marker, and the recovery scan's verdicts."""

from __future__ import annotations

import pytest

from tide.format import (
    DEFAULT_TIMER_LOG_SEGMENT_BYTES,
    NO_PREV_POS,
    TIMER_LOG_BLANK_BYTES,
    TIMER_LOG_UNIT_BYTES,
    TIMER_MAGIC_DEFAULT,
    TIMER_MAGIC_DELETE,
    TIMER_MAGIC_ROLL,
    TIMER_UNIT_COMMITLOG_POS,
    TimerLogEnd,
    TimerLogUnit,
    is_timer_blank,
    java_string_hashcode,
    last_unit_position,
    pack_timer_blank,
    pack_timer_unit,
    scan_timer_log_segment,
    timer_delete_key,
    timer_magic,
    timer_unit_error,
    timer_unit_fits,
    unpack_timer_unit,
)

T_WRITE = 1_700_000_000_000
SLOT_MS = 1_700_000_090_000
HASH = java_string_hashcode("TopicTest")
# Three units and the blank marker fill a segment exactly.
SEGMENT = 3 * TIMER_LOG_UNIT_BYTES + TIMER_LOG_BLANK_BYTES


def _unit(prev_pos: int = NO_PREV_POS, offset: int = 5_000, magic: int = 1) -> bytes:
    return pack_timer_unit(
        TimerLogUnit(prev_pos, magic, T_WRITE, SLOT_MS - T_WRITE, offset, 115, HASH)
    )


def _segment(*parts: bytes, size: int = SEGMENT) -> bytearray:
    data = bytearray(b"".join(parts))
    return data + bytearray(size - len(data))


def test_worked_example_unit_is_byte_exact() -> None:
    """docs/formats.md, "Timer log": the first unit of slot 1700000090000, written at
    1700000000000, for the 115-byte record at commitlog offset 5000 of TopicTest."""
    assert HASH == -1902610879
    data = _unit()
    assert data == bytes.fromhex(
        "00000034"  # size 52
        "FFFFFFFFFFFFFFFF"  # prev_pos -1: first unit of its slot
        "00000001"  # magic DEFAULT
        "0000018BCFE56800"  # enqueue_time_ms 1700000000000
        "00015F90"  # delay_ms 90000
        "0000000000001388"  # commitlog_offset 5000
        "00000073"  # commitlog_size 115
        "8E987641"  # hashCode("TopicTest")
        "0000000000000000"  # reserved
    )
    unit = unpack_timer_unit(data)
    assert unit.delayed_time_ms == SLOT_MS
    assert data[TIMER_UNIT_COMMITLOG_POS : TIMER_UNIT_COMMITLOG_POS + 8] == bytes.fromhex(
        "0000000000001388"
    )
    second = _unit(prev_pos=0, offset=5_115)
    assert second[4:12] == bytes.fromhex("0000000000000000")  # chained back to offset 0


def test_unit_round_trip_with_negative_delay() -> None:
    """A message already due when filed has a negative delay (delay_ms is signed)."""
    unit = TimerLogUnit(104, timer_magic(roll=True), T_WRITE, -3_000, 7, 99, -1, 0)
    assert unpack_timer_unit(pack_timer_unit(unit)) == unit
    assert unit.delayed_time_ms == T_WRITE - 3_000


def test_magic_bits() -> None:
    assert (TIMER_MAGIC_DEFAULT, TIMER_MAGIC_ROLL, TIMER_MAGIC_DELETE) == (1, 2, 4)
    assert timer_magic() == 1
    assert timer_magic(roll=True, delete=True) == 7


def test_recall_key() -> None:
    assert timer_delete_key("TopicTest", "7F00000100002A9F0000000000000001") == (
        "TopicTest+7F00000100002A9F0000000000000001"
    )


def test_blank_marker_bytes() -> None:
    """TimerLog.append: bytes left, a zero long, then the commitlog's blank magic."""
    assert pack_timer_blank(16) == bytes.fromhex("00000010 0000000000000000 CBD43194")


def test_units_fit_while_a_blank_still_fits_after() -> None:
    assert timer_unit_fits(68) and not timer_unit_fits(67)
    assert last_unit_position(DEFAULT_TIMER_LOG_SEGMENT_BYTES) == 104_857_532
    assert last_unit_position(SEGMENT) == 2 * TIMER_LOG_UNIT_BYTES


@pytest.mark.parametrize(
    ("data", "unit_offset", "says"),
    [
        (b"\0" * 52, 0, "size 0"),
        (_unit()[:40], 0, "only 40 bytes left"),
        (b"\x00\x00\x00\x35" + _unit()[4:], 0, "size 53"),
        (_unit(magic=0), 0, "magic 0x0"),  # RocketMQ's isMagicOK would take it
        (_unit(magic=TIMER_MAGIC_ROLL), 0, "magic 0x2"),
        (_unit(magic=0x11), 0, "magic 0x11"),
        (_unit(prev_pos=52), 52, "does not point back"),
        (_unit(prev_pos=-2), 0, "does not point back"),
        (_unit(offset=-1), 0, "commitlog reference"),
    ],
)
def test_not_a_unit(data: bytes, unit_offset: int, says: str) -> None:
    error = timer_unit_error(data, 0, unit_offset)
    assert error is not None and says in error


def test_a_unit() -> None:
    assert timer_unit_error(_unit(prev_pos=0), 0, 52) is None


def test_blank_must_reach_the_segment_end() -> None:
    data = _segment(_unit(), pack_timer_blank(SEGMENT - 52))
    assert is_timer_blank(data, 52, SEGMENT)
    assert not is_timer_blank(data, 52, SEGMENT + 1)
    assert not is_timer_blank(_segment(_unit(), pack_timer_blank(40)), 52, SEGMENT)


# The verdict table of docs/formats.md, "Timer log: torn tails and corruption", row by row.


def test_scan_full_segment_ends_at_blank() -> None:
    data = _segment(_unit(), _unit(0), _unit(52), pack_timer_blank(16))
    scan = scan_timer_log_segment(data, 1_000_000, durable_offset=1_000_000 + SEGMENT)
    assert scan.ending is TimerLogEnd.NEXT_SEGMENT
    assert (scan.end_offset, scan.units) == (1_000_000 + SEGMENT, 3)


def test_scan_zeros_past_durable_is_end() -> None:
    data = _segment(_unit(), _unit(0))
    scan = scan_timer_log_segment(data, 0, durable_offset=104)
    assert (scan.ending, scan.end_offset, scan.units) == (TimerLogEnd.END, 104, 2)


def test_scan_torn_unit_past_durable_is_torn_tail() -> None:
    """A unit whose head reached the file and whose tail did not."""
    data = _segment(_unit(), _unit(0)[:20])
    scan = scan_timer_log_segment(data, 0, durable_offset=52)
    assert (scan.ending, scan.end_offset, scan.units) == (TimerLogEnd.TORN_TAIL, 52, 1)
    assert "commitlog reference" in scan.reason


def test_scan_invalid_then_valid_past_durable_is_torn_tail() -> None:
    """Past the durable offset a hole is cut even when units follow: they are filed
    again from the timer topic's queue."""
    data = _segment(_unit(), bytes(52), _unit(0))
    scan = scan_timer_log_segment(data, 0, durable_offset=52)
    assert (scan.ending, scan.end_offset) == (TimerLogEnd.TORN_TAIL, 52)


def test_scan_zeros_below_durable_is_corrupt() -> None:
    """A flushed unit is gone."""
    data = _segment(_unit())
    scan = scan_timer_log_segment(data, 0, durable_offset=104)
    assert (scan.ending, scan.end_offset, scan.units) == (TimerLogEnd.CORRUPT, 52, 1)
    assert "size 0" in scan.reason


def test_scan_garbage_below_durable_is_corrupt() -> None:
    data = _segment(_unit(), b"\xff" * 52, _unit(0))
    scan = scan_timer_log_segment(data, 0, durable_offset=156)
    assert (scan.ending, scan.end_offset) == (TimerLogEnd.CORRUPT, 52)


def test_scan_of_a_later_segment_uses_absolute_offsets() -> None:
    """prev_pos and the durable offset are timer-log offsets, not segment positions."""
    start = 10 * SEGMENT
    data = _segment(_unit(prev_pos=start - 52), _unit(prev_pos=start))
    scan = scan_timer_log_segment(data, start, durable_offset=start)
    assert (scan.ending, scan.end_offset, scan.units) == (TimerLogEnd.END, start + 104, 2)
    forward = _segment(_unit(prev_pos=start + 52))
    assert scan_timer_log_segment(forward, start, start).ending is TimerLogEnd.TORN_TAIL

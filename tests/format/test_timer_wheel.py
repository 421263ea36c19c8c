"""The timer wheel's slots, where a timed message is filed, and the timer checkpoint."""

from __future__ import annotations

import pytest

from tide.format import (
    DEFAULT_TIMER_MAX_DELAY_S,
    DEFAULT_TIMER_PRECISION_MS,
    DEFAULT_TIMER_ROLL_WINDOW_SLOTS,
    EMPTY_SLOT,
    ROCKETMQ_TIMER_PRECISION_MS,
    TIMER_CHECKPOINT_FILE_BYTES,
    TIMER_SLOT_BYTES,
    TIMER_WHEEL_SLOTS_TOTAL,
    TimerCheckpoint,
    TimerEnqueue,
    TimerSlot,
    TimerWheelGeometry,
    first_pos_past,
    pack_slot,
    plan_timer_enqueue,
    put_wheel_slot,
    read_wheel_slot,
    timer_deliver_error,
    timer_precision_ms,
    timer_roll_window_slots,
    timer_slot_time_ms,
    unpack_slot,
    wheel_file_error,
)

SLOT_MS = 1_700_000_090_000
# RocketMQ's geometry (1 s slots): the worked examples of docs/formats.md use it.
G = TimerWheelGeometry(ROCKETMQ_TIMER_PRECISION_MS)
SMALL = TimerWheelGeometry(ROCKETMQ_TIMER_PRECISION_MS, slots_total=64)  # 128 slots of 1 s
DAY_MS = 86_400_000


def test_default_geometry_is_rocketmqs() -> None:
    assert TIMER_WHEEL_SLOTS_TOTAL == 604_800  # 7 days of seconds
    assert (G.precision_ms, G.wheel_slots, G.file_bytes) == (1000, 1_209_600, 38_707_200)
    assert DEFAULT_TIMER_ROLL_WINDOW_SLOTS == 172_800
    assert DEFAULT_TIMER_MAX_DELAY_S == 259_200


def test_tides_default_precision_covers_the_max_delay_and_roll_window() -> None:
    """Tide's default slot is 500 ms (RocketMQ's 1000 ms): the wheel keeps its slot count,
    so one lap is 7 days, past the 3-day maximum delay; the roll window (172,800 slots)
    is then 1 day, and a message due at the maximum is filed at its end, within the lap,
    to be filed again from there (docs/formats.md, "Timer wheel")."""
    tide = TimerWheelGeometry()
    assert tide.precision_ms == DEFAULT_TIMER_PRECISION_MS == 500
    lap_ms = tide.wheel_slots * tide.precision_ms
    assert lap_ms == 7 * DAY_MS > DEFAULT_TIMER_MAX_DELAY_S * 1000
    window_ms = DEFAULT_TIMER_ROLL_WINDOW_SLOTS * tide.precision_ms
    assert window_ms == DAY_MS
    now = SLOT_MS
    farthest = plan_timer_enqueue(
        tide, now + DEFAULT_TIMER_MAX_DELAY_S * 1000, now, DEFAULT_TIMER_ROLL_WINDOW_SLOTS
    )
    assert farthest == TimerEnqueue(now + window_ms, roll=True)
    assert farthest.slot_time_ms - now < lap_ms  # never on a slot of the next lap


def test_worked_example_slot_is_byte_exact() -> None:
    """docs/formats.md, "Timer wheel": slot 1700000090000 after its two units (timer-log
    offsets 0 and 52) were filed."""
    assert G.slot_index(SLOT_MS) == 512_090
    assert G.slot_position(SLOT_MS) == 16_386_880
    slot = TimerSlot(SLOT_MS, 0, 52, 2, 0)
    data = pack_slot(G, slot)
    assert data == bytes.fromhex(
        "000000006553F15A"  # time 1700000090 (ms / precision)
        "0000000000000000"  # first_pos 0
        "0000000000000034"  # last_pos 52
        "00000002"  # num 2
        "00000000"  # magic
    )
    wheel = bytearray(G.file_bytes)
    put_wheel_slot(G, wheel, slot)
    assert wheel[16_386_880 : 16_386_880 + TIMER_SLOT_BYTES] == data
    assert read_wheel_slot(G, wheel, SLOT_MS) == slot
    assert read_wheel_slot(G, wheel, SLOT_MS + 999) == slot  # same period


def test_slot_of_another_lap_reads_empty() -> None:
    wheel = bytearray(SMALL.file_bytes)
    put_wheel_slot(SMALL, wheel, TimerSlot(SLOT_MS, 0, 52, 2))
    next_lap = SLOT_MS + SMALL.wheel_slots * 1000
    assert SMALL.slot_index(next_lap) == SMALL.slot_index(SLOT_MS)
    assert read_wheel_slot(SMALL, wheel, next_lap) == EMPTY_SLOT
    assert unpack_slot(SMALL, wheel, SMALL.slot_position(next_lap)).time_ms == SLOT_MS


def test_finer_precision_stores_time_in_its_units() -> None:
    g = TimerWheelGeometry(precision_ms=100, slots_total=64)
    slot = TimerSlot(SLOT_MS + 300, 7, 7, 1)
    assert pack_slot(g, slot)[:8] == (17_000_000_903).to_bytes(8, "big")
    wheel = bytearray(g.file_bytes)
    put_wheel_slot(g, wheel, slot)
    assert read_wheel_slot(g, wheel, SLOT_MS + 399) == slot
    assert read_wheel_slot(g, wheel, SLOT_MS + 400) == EMPTY_SLOT


@pytest.mark.parametrize(
    ("configured", "used"),
    [(1, 100), (150, 100), (200, 200), (499, 200), (500, 500), (999, 500), (1000, 1000),
     (60_000, 1000)],
)  # fmt: skip
def test_precision_rounds_down_to_a_candidate(configured: int, used: int) -> None:
    assert timer_precision_ms(configured) == used


def test_geometry_refuses_other_precisions_and_tiny_wheels() -> None:
    with pytest.raises(ValueError, match="100, 200, 500, 1000"):
        TimerWheelGeometry(precision_ms=300)
    with pytest.raises(ValueError, match="more than 60"):
        TimerWheelGeometry(slots_total=60)


@pytest.mark.parametrize(
    ("configured", "used"),
    [(172_800, 172_800), (2, 2), (1, 604_740), (0, 604_740), (604_740, 604_740),
     (604_741, 604_740)],
)  # fmt: skip
def test_roll_window_is_clamped(configured: int, used: int) -> None:
    assert timer_roll_window_slots(configured) == used


@pytest.mark.parametrize(
    ("deliver_ms", "slot_ms"),
    [(SLOT_MS + 500, SLOT_MS), (SLOT_MS + 1, SLOT_MS), (SLOT_MS, SLOT_MS - 1000),
     (SLOT_MS + 999, SLOT_MS)],
)  # fmt: skip
def test_delivery_time_to_slot(deliver_ms: int, slot_ms: int) -> None:
    assert timer_slot_time_ms(G, deliver_ms) == slot_ms


@pytest.mark.parametrize("precision_ms", [100, 200, 500, 1000])
def test_a_slot_never_fires_early_nor_a_period_late(precision_ms: int) -> None:
    """A slot fires once its period is over (the wheel reads slot t when the write time
    has passed t): at or after the delivery time, and less than one period after it."""
    g = TimerWheelGeometry(precision_ms=precision_ms, slots_total=64)
    for deliver_ms in range(SLOT_MS - 2 * precision_ms, SLOT_MS + 2 * precision_ms):
        fires_ms = timer_slot_time_ms(g, deliver_ms) + precision_ms
        assert deliver_ms <= fires_ms < deliver_ms + precision_ms


def test_enqueue_within_the_roll_window() -> None:
    assert plan_timer_enqueue(G, 9_999, 0, 10) == TimerEnqueue(9_999, roll=False)


def test_enqueue_just_past_the_window_files_at_half() -> None:
    """Past the window by less than a third of it: filed at half the window, so the
    next roll still has time to spare (TimerMessageStore.doEnqueue)."""
    assert plan_timer_enqueue(G, 10_000, 0, 10) == TimerEnqueue(5_000, roll=True)
    assert plan_timer_enqueue(G, 12_999, 0, 10) == TimerEnqueue(5_000, roll=True)


def test_enqueue_far_past_the_window_files_at_its_end() -> None:
    assert plan_timer_enqueue(G, 13_000, 0, 10) == TimerEnqueue(10_000, roll=True)
    far = plan_timer_enqueue(G, 3 * 86_400_000, 0, DEFAULT_TIMER_ROLL_WINDOW_SLOTS)
    assert far == TimerEnqueue(2 * 86_400_000, roll=True)


def test_deliver_time_limits() -> None:
    now = 1_000_000
    assert timer_deliver_error(now - 5, now, DEFAULT_TIMER_MAX_DELAY_S) is None  # past: now
    assert timer_deliver_error(now + 259_200_000, now, DEFAULT_TIMER_MAX_DELAY_S) is None
    error = timer_deliver_error(now + 259_200_001, now, DEFAULT_TIMER_MAX_DELAY_S)
    assert error is not None and "259200 s (timerMaxDelaySec)" in error


def test_wheel_file_length() -> None:
    assert wheel_file_error(G, 0) is None
    assert wheel_file_error(G, 38_707_200) is None
    error = wheel_file_error(G, SMALL.file_bytes)
    assert error is not None and "4096 bytes" in error and "38707200" in error


def test_first_pos_past_the_log_end() -> None:
    """TimerWheel.checkPhyPos: slots of this lap naming units at or past the log end."""
    wheel = bytearray(SMALL.file_bytes)
    start = SLOT_MS
    put_wheel_slot(SMALL, wheel, TimerSlot(start, 0, 100, 2))  # inside the log
    put_wheel_slot(SMALL, wheel, TimerSlot(start + 5_000, 150, 220, 2))  # past it
    put_wheel_slot(SMALL, wheel, TimerSlot(start + 9_000, 120, 200, 2))  # at the end
    put_wheel_slot(SMALL, wheel, TimerSlot(start - 3_000, 10, 999, 1))  # last lap's slot
    assert first_pos_past(SMALL, wheel, start, 200) == 120
    assert first_pos_past(SMALL, wheel, start, 221) is None
    # Read from later on, the slot at start - 3 s is the lap's last slot, and counts.
    wraps = start + (SMALL.wheel_slots - 3) * 1000
    put_wheel_slot(SMALL, wheel, TimerSlot(wraps, 10, 999, 1))
    assert first_pos_past(SMALL, wheel, start, 200) == 10


def test_worked_example_timer_checkpoint_is_byte_exact() -> None:
    """docs/formats.md, "Timer checkpoint"."""
    cp = TimerCheckpoint(SLOT_MS, 104, 7, 7, 0, 1_700_000_000_000, 3)
    data = cp.pack()
    assert data == bytes.fromhex(
        "0000018BCFE6C790"  # last_read_time_ms 1700000090000
        "0000000000000068"  # last_timer_log_flush_pos 104
        "0000000000000007"  # last_timer_queue_offset 7
        "0000000000000007"  # master_timer_queue_offset 7
        "0000000000000000"  # state_version
        "0000018BCFE56800"  # data version timestamp 1700000000000
        "0000000000000003"  # data version counter
    )
    page = cp.pack_file()
    assert len(page) == TIMER_CHECKPOINT_FILE_BYTES and page[:56] == data
    assert not any(page[56:])
    assert TimerCheckpoint.unpack(page) == cp
    assert TimerCheckpoint.unpack(data) == cp


def test_older_timer_checkpoint_without_data_version() -> None:
    cp = TimerCheckpoint.unpack(TimerCheckpoint(SLOT_MS, 104, 7, 7, 9, 9, 9).pack()[:32])
    assert cp == TimerCheckpoint(SLOT_MS, 104, 7, 7)


@pytest.mark.parametrize("size", [0, 31, 33, 55])
def test_timer_checkpoint_of_a_wrong_length(size: int) -> None:
    with pytest.raises(ValueError, match="needs 56"):
        TimerCheckpoint.unpack(bytes(size))

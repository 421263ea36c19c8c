"""Retention and the disk guard: expiry at the cleanup hour, the disk thresholds, held
segments, reads below the min offset. A fake clock drives expiry and the cleanup hour;
the disk usage ratio comes from a hook; passes run from the test (``run_once``), the
background thread's interval being far longer than any test."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from services.storage.engine.commitlog import OffsetBelowMinError
from services.storage.engine.errors import DiskFullError
from services.storage.engine.message_store import MessageStore
from tests.services.storage.engine._recovery_helpers import (
    HOUR_S,
    SEGMENT_BYTES,
    Harness,
    Written,
    assert_contiguous_queue_offsets,
    crash,
    fill_segments,
    message,
    next_offsets_of,
    put,
    read_all,
)
from tide.waiting import wait_until


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "store")
    yield h
    h.close_all()


def hour_of(timestamp_s: float) -> int:
    return datetime.fromtimestamp(timestamp_s).hour


def starts_of(store: MessageStore) -> list[int]:
    return [s.start_offset for s in store.segments.segments]


def fill(store: MessageStore, segments: int) -> list[Written]:
    """``segments`` segments, the last one holding a single record."""
    written = fill_segments(store, segments - 1)
    written += put(store, [message("Fill", 0, b"first record of the last segment" * 40)])
    assert len(store.segments.segments) == segments
    return written


class FakeClock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


# -- expiry --------------------------------------------------------------------------------


def test_expired_segments_are_deleted_at_the_cleanup_hour(harness: Harness) -> None:
    at_hour = time.time() + 1000 * HOUR_S  # every segment written now is long expired
    clock = FakeClock(at_hour + 6 * HOUR_S)  # another hour of the day
    store = harness.open(
        clock_s=clock,
        retention_hours=1.0,
        cleanup_hour=hour_of(at_hour),
        delete_segments_per_pass=2,
    )
    fill(store, 6)
    starts = starts_of(store)
    paths = [harness.segment_path(start) for start in starts]

    store.retention.run_once()  # not the cleanup hour, disk at 10 %: nothing
    assert starts_of(store) == starts
    assert all(p.exists() for p in paths)
    assert store.retention.deleted_segments == 0

    clock.now_s = at_hour
    store.retention.run_once()  # oldest first, two per pass
    assert store.segments.min_offset == starts[2]
    assert [p.exists() for p in paths] == [False, False, True, True, True, True]
    store.retention.run_once()
    assert store.segments.min_offset == starts[4]
    store.retention.run_once()  # never the segment being written
    assert starts_of(store) == [starts[5]]
    store.retention.run_once()
    assert starts_of(store) == [starts[5]]
    assert [p.exists() for p in paths] == [False] * 5 + [True]
    assert store.retention.deleted_segments == 5
    assert store.status().min_offset == starts[5]
    assert store.status().segment_count == 1

    max_before = store.segments.max_offset
    (w,) = put(store, [message("Fill", 1, b"still writable")])
    assert w.offset == max_before


def test_segments_younger_than_the_retention_are_kept(harness: Harness) -> None:
    """Expiry goes by each segment's last write (store timestamps, written here far in
    the future so the files' mtimes do not decide), oldest first, stopping at the first
    segment still within the retention."""
    real_now_ms = int(time.time() * 1000)
    stamps = [real_now_ms + (k + 1) * 10 * 3_600_000 for k in range(4)]
    store_clock = [stamps[0]]

    def on_roll(k: int) -> None:
        store_clock[0] = stamps[k]

    clock = FakeClock(time.time())
    store = harness.open(
        clock_ms=lambda: store_clock[0],
        clock_s=clock,
        retention_hours=1.0,
        cleanup_hour=hour_of(time.time() + 12 * HOUR_S),
    )
    fill_segments(store, 3, on_roll=on_roll)
    on_roll(3)
    put(store, [message("Fill", 0, b"x" * 1000)])
    segments = list(store.segments.segments)
    assert len(segments) == 4
    last_write_s = [s.last_store_timestamp_ms / 1000 for s in segments]
    assert last_write_s == sorted(last_write_s)
    starts = starts_of(store)
    harness.ratio[0] = 0.80  # above the clean ratio: expired segments go at any hour

    clock.now_s = last_write_s[0] - 0.5 * HOUR_S
    store.retention.run_once()
    assert starts_of(store) == starts  # nothing expired yet

    clock.now_s = last_write_s[0] + 1.5 * HOUR_S  # segment 0 expired, segment 1 not
    assert clock.now_s < last_write_s[1] + HOUR_S
    store.retention.run_once()
    assert starts_of(store) == starts[1:]
    store.retention.run_once()
    assert starts_of(store) == starts[1:]

    clock.now_s = last_write_s[2] + 1.5 * HOUR_S
    store.retention.run_once()
    assert starts_of(store) == starts[3:]


def test_an_unexpired_oldest_segment_blocks_deletion_behind_it(harness: Harness) -> None:
    """Like RocketMQ, retention never deletes a segment in the middle of the log."""
    clock = FakeClock(time.time() + 1000 * HOUR_S)
    store = harness.open(clock_s=clock, retention_hours=1.0, cleanup_hour=hour_of(clock.now_s))
    fill(store, 4)
    starts = starts_of(store)
    first = harness.segment_path(starts[0])
    os.utime(first, (clock.now_s, clock.now_s - 60))  # touched a minute ago

    store.retention.run_once()
    assert starts_of(store) == starts

    os.utime(first, (time.time(), time.time()))
    store.retention.run_once()
    assert starts_of(store) == starts[3:]
    assert not first.exists()


def test_manual_delete_request_runs_a_pass_off_hour(harness: Harness) -> None:
    clock = FakeClock(time.time() + 1000 * HOUR_S)
    store = harness.open(
        clock_s=clock, retention_hours=1.0, cleanup_hour=hour_of(clock.now_s + 12 * HOUR_S)
    )
    fill(store, 3)
    starts = starts_of(store)
    store.retention.run_once()
    assert starts_of(store) == starts  # off hour, disk low
    store.retention.request_delete()  # the background thread runs the pass
    # The pass takes the segments out of the list first, then deletes their files (a
    # held one later): wait for both, not for the list alone.
    files = [harness.segment_path(start) for start in starts[:2]]
    wait_until(
        lambda: starts_of(store) == starts[2:] and not any(path.exists() for path in files),
        what="the requested deletion (out of the list, files deleted)",
    )


# -- disk thresholds -------------------------------------------------------------------------


@pytest.mark.parametrize(("ratio", "deleted"), [(0.75, 0), (0.76, 3)])
def test_disk_above_the_clean_ratio_deletes_expired_segments_off_hour(
    harness: Harness, ratio: float, deleted: int
) -> None:
    clock = FakeClock(time.time() + 1000 * HOUR_S)
    store = harness.open(
        clock_s=clock, retention_hours=1.0, cleanup_hour=hour_of(clock.now_s + 12 * HOUR_S)
    )
    fill(store, 4)
    starts = starts_of(store)
    harness.ratio[0] = ratio
    store.retention.run_once()
    assert starts_of(store) == starts[deleted:]
    assert store.status().disk_usage_ratio == ratio
    assert store.status().writable


@pytest.mark.parametrize(("ratio", "deleted"), [(0.85, 0), (0.86, 2)])
def test_disk_above_the_force_ratio_deletes_unexpired_segments(
    harness: Harness, ratio: float, deleted: int
) -> None:
    clock = FakeClock(time.time())  # nothing is expired
    store = harness.open(
        clock_s=clock,
        retention_hours=72.0,
        cleanup_hour=hour_of(clock.now_s),
        delete_segments_per_pass=2,
    )
    fill(store, 4)
    starts = starts_of(store)
    store.retention.run_once()  # the cleanup hour, but nothing expired
    assert starts_of(store) == starts

    harness.ratio[0] = ratio
    store.retention.run_once()
    assert starts_of(store) == starts[deleted:]
    if deleted:
        store.retention.run_once()
        assert starts_of(store) == starts[3:]  # never the segment being written
        assert store.retention.deleted_segments == 3


def test_disk_above_the_refuse_ratio_refuses_appends(harness: Harness) -> None:
    store = harness.open()
    put(store, [message("Guard", 0, b"before")])
    harness.ratio[0] = 0.90  # at the threshold: still writable
    store.retention.run_once()
    put(store, [message("Guard", 0, b"at the threshold")])
    assert store.status().writable

    harness.ratio[0] = 0.91
    store.retention.run_once()
    status = store.status()
    assert not status.writable
    assert status.disk_usage_ratio == 0.91
    max_before = store.segments.max_offset
    with pytest.raises(DiskFullError):
        store.put([message("Guard", 0, b"refused")])
    assert store.segments.max_offset == max_before
    assert store.commitlog.offsets.next_offsets[("Guard", 0)] == 2

    harness.ratio[0] = 0.60
    store.retention.run_once()
    assert store.status().writable
    (after,) = put(store, [message("Guard", 0, b"after")])
    assert after.queue_offset == 2
    assert after.offset == max_before


def test_disk_full_at_open_refuses_the_first_append(harness: Harness) -> None:
    harness.ratio[0] = 0.95
    store = harness.open()
    assert not store.status().writable
    with pytest.raises(DiskFullError):
        store.put([message("Guard", 0, b"refused")])
    assert store.segments.max_offset == 0


# -- held segments ---------------------------------------------------------------------------


def test_held_segment_is_deleted_when_released(harness: Harness) -> None:
    store = harness.open()
    fill(store, 2)
    oldest = store.segments.segments[0]
    path = oldest.path
    assert oldest.hold()
    harness.ratio[0] = 0.86  # force: delete the oldest now

    store.retention.run_once()
    assert store.segments.min_offset == SEGMENT_BYTES  # out of the log at once
    assert path.exists()  # but the file stays while a reader holds it
    assert not oldest.closed
    assert oldest.read(4, 4) == bytes.fromhex("DAA320A7")  # the mapping is still valid
    assert not oldest.hold()  # no new readers once destruction was requested
    store.retention.run_once()
    assert path.exists()

    oldest.release()
    store.retention.run_once()
    assert not path.exists()
    assert oldest.closed
    assert store.retention.deleted_segments == 1


def test_held_segment_is_deleted_forcibly_after_the_grace_period(harness: Harness) -> None:
    store = harness.open(held_segment_force_delete_ms=50)
    fill(store, 2)
    oldest = store.segments.segments[0]
    assert oldest.hold()
    harness.ratio[0] = 0.86
    requested = time.monotonic()
    store.retention.run_once()
    assert oldest.path.exists()

    def deleted() -> bool:
        store.retention.run_once()
        return not oldest.path.exists()

    wait_until(deleted, what="the forced deletion of a held segment")
    assert time.monotonic() - requested >= 0.05
    assert oldest.closed


# -- reading and restarting after deletion -----------------------------------------------------


def test_reads_below_the_min_offset_raise(harness: Harness) -> None:
    store = harness.open()
    written = fill(store, 3)
    harness.ratio[0] = 0.86
    store.retention.run_once()
    assert store.segments.min_offset == 2 * SEGMENT_BYTES
    gone = [w for w in written if w.offset < 2 * SEGMENT_BYTES]
    kept = [w for w in written if w.offset >= 2 * SEGMENT_BYTES]
    assert gone and kept
    for w in (gone[0], gone[-1]):
        with pytest.raises(OffsetBelowMinError):
            store.commitlog.read_record(w.offset, w.size)
    with pytest.raises(OffsetBelowMinError):
        store.commitlog.read_raw(0, 100)
    record = store.commitlog.read_record(kept[0].offset, kept[0].size)
    assert (record.body, record.queue_offset) == (kept[0].body, kept[0].queue_offset)


@pytest.mark.parametrize("how", ["clean", "crash"])
def test_queue_offsets_survive_retention_and_restart(harness: Harness, how: str) -> None:
    store = harness.open()
    written = fill(store, 4)
    # Every queue has a record in the segment that survives: without a snapshot (the
    # crash case) the offsets of the others could only come from the deleted segments.
    written += put(store, [message("Fill", 1, b"in the last segment too")])
    expected = next_offsets_of(written)
    harness.ratio[0] = 0.86
    store.retention.run_once()
    assert store.segments.min_offset == 3 * SEGMENT_BYTES
    max_offset = store.segments.max_offset
    harness.ratio[0] = 0.10
    if how == "clean":
        store.close()
    else:
        crash(store)

    store = harness.open()
    assert store.segments.min_offset == 3 * SEGMENT_BYTES
    assert store.segments.max_offset == max_offset
    assert store.commitlog.offsets.next_offsets == expected
    for (topic, queue_id), next_offset in expected.items():
        (w,) = put(store, [message(topic, queue_id, b"after restart")])
        assert w.queue_offset == next_offset
    assert_contiguous_queue_offsets(read_all(store))

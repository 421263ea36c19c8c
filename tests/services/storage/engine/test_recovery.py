"""Recovery at open: normal and abnormal paths, torn tails, corruption, the checkpoint's
start segment and the queue offset snapshot. Real files, in-process stores; a crash is
simulated by stopping a store without its clean close (see ``_recovery_helpers``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.storage.engine.config import FlushMode
from services.storage.engine.message_store import MessageStore
from services.storage.engine.recovery import RecoveryReport
from tests.services.storage.engine._recovery_helpers import (
    BODY_POS,
    HOUR_MS,
    SEGMENT_BYTES,
    Harness,
    Written,
    assert_contiguous_queue_offsets,
    body_for,
    crash,
    create_empty_segment,
    fill_segments,
    message,
    next_offsets_of,
    patch_file,
    put,
    put_many,
    read_all,
    read_file,
    record_durable,
    remove_snapshot,
    write_checkpoint,
)
from tide.commitlog import verify
from tide.format import (
    SNAPSHOT_FILE,
    Snapshot,
    TailMarks,
    read_snapshot,
    read_tail_marks,
    write_snapshot,
)
from tide.waiting import wait_until


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "store")
    yield h
    h.close_all()


def report_of(store: MessageStore) -> RecoveryReport:
    assert store.recovery is not None
    return store.recovery


def stop(store: MessageStore, how: str) -> None:
    if how == "clean":
        store.close()
    else:
        crash(store)


def assert_continues(store: MessageStore, expected_next: dict[tuple[str, int], int]) -> None:
    """One more message per known queue gets exactly the expected queue offset, and the
    whole log then has gap-free, duplicate-free queue offsets."""
    max_before = store.segments.max_offset
    for (topic, queue_id), next_offset in sorted(expected_next.items()):
        (w,) = put(store, [message(topic, queue_id, b"after-recovery")])
        assert w.queue_offset == next_offset, (topic, queue_id)
        assert w.offset >= max_before
    rebuilt = assert_contiguous_queue_offsets(read_all(store))
    assert rebuilt == {key: n + 1 for key, n in expected_next.items()}


def tear(path: Path, record: Written, how: str) -> None:
    """Make ``record`` look like a write the crash interrupted."""
    if how == "zero-second-half":
        half = record.size // 2
        patch_file(path, record.offset % SEGMENT_BYTES + half, bytes(record.size - half))
    elif how == "garbage-second-half":
        half = record.size // 2
        patch_file(path, record.offset % SEGMENT_BYTES + half, b"\xab" * (record.size - half))
    elif how == "only-size-field":
        patch_file(path, record.offset % SEGMENT_BYTES + 4, bytes(record.size - 4))
    else:
        raise AssertionError(how)


def flip_body_byte(path: Path, record: Written) -> None:
    pos = record.offset % SEGMENT_BYTES + BODY_POS + 3
    (old,) = read_file(path, pos, 1)
    patch_file(path, pos, bytes([old ^ 0xFF]))


def is_zero(data: bytes) -> bool:
    return not any(data)


# -- normal and abnormal paths ---------------------------------------------------------


def test_normal_recovery_after_clean_close(harness: Harness) -> None:
    store = harness.open()
    assert harness.abort_path.exists()
    written = put_many(store, 400)
    starts = [s.start_offset for s in store.segments.segments]
    assert len(starts) >= 4
    max_offset = store.segments.max_offset
    next_offsets = dict(store.commitlog.offsets.next_offsets)
    assert next_offsets == next_offsets_of(written)
    store.close()
    assert not harness.abort_path.exists()
    assert (harness.store_dir / SNAPSHOT_FILE).exists()

    store = harness.open()
    report = report_of(store)
    assert report.mode == "normal"
    assert report.snapshot_used
    assert report.corruption == []
    assert report.torn_tail_offset is None
    # RocketMQ's normal recovery verifies the last three segments only.
    assert report.start_offset == starts[-3]
    assert report.end_offset == max_offset
    assert store.segments.max_offset == max_offset
    assert store.segments.min_offset == 0
    assert [s.start_offset for s in store.segments.segments] == starts
    assert store.commitlog.offsets.next_offsets == next_offsets
    assert harness.abort_path.exists()
    records = read_all(store)
    assert [(r.physical_offset, r.queue_offset, r.body) for r in records] == [
        (w.offset, w.queue_offset, w.body) for w in written
    ]
    assert_continues(store, next_offsets)


@pytest.mark.parametrize(
    ("flush_mode", "pool"),
    [(FlushMode.ASYNC, False), (FlushMode.SYNC, False), (FlushMode.ASYNC, True)],
    ids=["async", "sync", "async-write-buffer-pool"],
)
def test_abnormal_recovery_keeps_everything_written(
    harness: Harness, flush_mode: FlushMode, pool: bool
) -> None:
    store = harness.open(flush_mode=flush_mode, write_buffer_pool_enabled=pool)
    written: list[Written] = []
    for index in range(300):
        msg = message(f"Topic{index % 3}", index % 4, body_for(index, 500 + index % 300))
        result = store.put([msg])
        if result.durable is not None:
            result.durable.result(timeout=10)
        (offset, size, queue_offset) = result.batch.positions[0]
        written.append(Written(offset, size, queue_offset, msg.topic, msg.queue_id, msg.body))
    assert (flush_mode is FlushMode.SYNC) == (store.group_commit is not None)
    max_offset = store.segments.max_offset
    assert max_offset > 2 * SEGMENT_BYTES
    crash(store)

    store = harness.open(flush_mode=flush_mode, write_buffer_pool_enabled=pool)
    report = report_of(store)
    assert report.mode == "abnormal"
    assert report.corruption == []
    assert report.torn_tail_offset is None
    assert report.snapshot_used  # the one the first open wrote at offset 0: replay all
    assert report.start_offset == 0  # no checkpoint yet: verify everything
    assert report.end_offset == max_offset
    assert store.segments.max_offset == max_offset
    records = read_all(store)
    assert [(r.physical_offset, r.topic, r.queue_id, r.queue_offset, r.body) for r in records] == [
        (w.offset, w.topic, w.queue_id, w.queue_offset, w.body) for w in written
    ]
    expected = next_offsets_of(written)
    assert store.commitlog.offsets.next_offsets == expected
    assert_continues(store, expected)


def test_abnormal_recovery_with_the_real_checkpoint_and_snapshot(harness: Harness) -> None:
    """The checkpoint service writes the checkpoint and a snapshot while the store runs;
    a crash later recovers from them."""
    fast: dict[str, Any] = {
        "checkpoint_interval_ms": 20,
        "flush_interval_ms": 20,
        "flush_least_pages": 0,
    }
    store = harness.open(**fast)
    first = put_many(store, 100)
    snapshot_path = harness.store_dir / SNAPSHOT_FILE
    wait_until(snapshot_path.exists, what="the first queue offset snapshot")
    wait_until((harness.store_dir / "checkpoint").exists, what="the checkpoint file")
    snapshot = read_snapshot(harness.store_dir)
    assert snapshot is not None
    # Captured under the append lock, written once flushed past it.
    assert snapshot.commitlog_offset <= snapshot.flushed_offset
    more = put_many(store, 100, start=100)
    max_offset = store.segments.max_offset
    crash(store)

    store = harness.open(**fast)
    report = report_of(store)
    assert report.mode == "abnormal"
    assert report.snapshot_used
    assert report.corruption == []
    assert report.end_offset == max_offset
    expected = next_offsets_of(first + more)
    assert store.commitlog.offsets.next_offsets == expected
    assert_continues(store, expected)


# -- torn tails and corruption ---------------------------------------------------------


@pytest.mark.parametrize("how", ["zero-second-half", "garbage-second-half", "only-size-field"])
def test_torn_record_at_the_tail(harness: Harness, how: str) -> None:
    store = harness.open()
    written = put_many(store, 40)
    last = written[-1]
    assert last.offset + last.size < SEGMENT_BYTES  # everything in segment 0
    crash(store)
    path = harness.segment_path(0)
    tear(path, last, how)

    store = harness.open()
    report = report_of(store)
    assert report.mode == "abnormal"
    assert report.torn_tail_offset == last.offset
    assert report.corruption == []
    assert report.end_offset == last.offset
    assert store.segments.max_offset == last.offset
    # The torn bytes are zeroed, so a later crash cannot mistake them for records.
    assert is_zero(read_file(path, last.offset, SEGMENT_BYTES - last.offset))
    assert len(read_all(store)) == len(written) - 1
    expected = next_offsets_of(written[:-1])
    assert store.commitlog.offsets.next_offsets == expected
    (again,) = put(store, [message(last.topic, last.queue_id, b"replacement")])
    assert again.offset == last.offset
    assert again.queue_offset == last.queue_offset  # the torn record's offset is reused
    assert_contiguous_queue_offsets(read_all(store))


@pytest.mark.parametrize("how", ["clean", "crash"])
def test_crc_mismatch_in_the_middle(harness: Harness, how: str) -> None:
    store = harness.open()
    written = put_many(store, 40)
    victim = written[20]
    old_max = store.segments.max_offset
    assert old_max < SEGMENT_BYTES
    if how == "clean":
        store.close()
    else:
        crash(store, durable=True)
    path = harness.segment_path(0)
    flip_body_byte(path, victim)

    store = harness.open()
    report = report_of(store)
    assert report.mode == ("normal" if how == "clean" else "abnormal")
    assert report.corruption, report
    assert any(str(victim.offset) in text for text in report.corruption), report.corruption
    assert any("CRC" in text for text in report.corruption), report.corruption
    assert report.torn_tail_offset is None
    # RocketMQ cuts the log at the first bad record.
    assert report.end_offset == victim.offset
    assert store.segments.max_offset == victim.offset
    if how == "clean":
        assert not report.snapshot_used  # the clean close's snapshot lies past the cut
    assert is_zero(read_file(path, victim.offset, old_max - victim.offset))
    records = read_all(store)
    assert [r.physical_offset for r in records] == [w.offset for w in written[:20]]
    expected = next_offsets_of(written[:20])
    assert store.commitlog.offsets.next_offsets == expected
    (again,) = put(store, [message(victim.topic, victim.queue_id, b"x")])
    assert again.offset == victim.offset
    assert again.queue_offset == victim.queue_offset


def test_zeroed_record_in_the_middle_is_corruption(harness: Harness) -> None:
    store = harness.open()
    written = put_many(store, 30)
    victim = written[12]
    crash(store, durable=True)
    patch_file(harness.segment_path(0), victim.offset, bytes(victim.size))

    store = harness.open()
    report = report_of(store)
    assert report.torn_tail_offset is None
    assert any(
        str(victim.offset) in text and str(written[13].offset) in text for text in report.corruption
    ), report.corruption
    assert store.segments.max_offset == victim.offset
    assert store.commitlog.offsets.next_offsets == next_offsets_of(written[:12])


# Where a copy the crash interrupted left zeros: glibc's memcpy stores the first bytes of
# a copy last (the batch's first record has no header), or a page is missing (a power
# loss keeps any subset of the unflushed pages).
HOLES = {"first-bytes-stored-last": (0, 32), "page-inside-the-second-record": (1, 4096)}


@pytest.mark.parametrize("hole", sorted(HOLES))
def test_write_interrupted_out_of_order_is_a_torn_tail(harness: Harness, hole: str) -> None:
    store = harness.open()
    before = put_many(store, 20)
    record_durable(store)
    batch = put(store, [message("Batch", i % 2, body_for(i, 3000)) for i in range(4)])
    old_max = store.segments.max_offset
    crash(store)
    record_index, hole_bytes = HOLES[hole]
    damaged = batch[record_index]
    start = damaged.offset + (0 if record_index == 0 else 1000)
    patch_file(harness.segment_path(0), start, bytes(hole_bytes))

    marks = read_tail_marks(harness.store_dir)
    assert marks == TailMarks(before[-1].offset + before[-1].size, crashed=True)
    verified = verify(harness.store_dir / "commitlog", marks=marks)
    assert verified.valid, verified.corruption
    assert verified.torn_tail is not None and verified.torn_tail.offset == damaged.offset
    tail = read_file(harness.segment_path(0), damaged.offset, old_max - damaged.offset)
    assert verified.torn_tail.bytes == len(tail.rstrip(b"\0"))  # to the last non-zero byte
    assert "the write the crash interrupted" in verified.torn_tail.reason
    strict = verify(harness.store_dir / "commitlog")  # no store root: nothing to go by
    assert [f.offset for f in strict.corruption] == [damaged.offset]

    store = harness.open()
    report = report_of(store)
    assert report.corruption == [], report
    assert report.torn_tail_offset == damaged.offset
    first_whole = next(w for w in batch if w.offset >= start + hole_bytes)
    assert report.torn_tail_data_after == first_whole.offset
    assert "an interrupted write" in report.summary()
    assert store.segments.max_offset == damaged.offset
    assert is_zero(read_file(harness.segment_path(0), damaged.offset, old_max - damaged.offset))
    kept = before + batch[:record_index]
    assert store.commitlog.offsets.next_offsets == next_offsets_of(kept)
    assert_continues(store, next_offsets_of(kept))


def test_damage_past_the_durable_offset_without_a_crash_is_corruption(harness: Harness) -> None:
    """No abort file: the last close was clean, no write was in flight. (A clean close
    records everything as durable; here the snapshot is gone too.)"""
    store = harness.open()
    written = put_many(store, 30)
    store.close()
    remove_snapshot(harness.store_dir)
    victim = written[25]
    patch_file(harness.segment_path(0), victim.offset, bytes(32))

    store = harness.open()
    report = report_of(store)
    assert report.mode == "normal"
    assert report.torn_tail_offset is None
    assert any(
        str(victim.offset) in text and str(written[26].offset) in text for text in report.corruption
    ), report.corruption
    assert store.segments.max_offset == victim.offset


def test_torn_tail_before_an_empty_preallocated_segment_is_a_clean_end(harness: Harness) -> None:
    store = harness.open()
    written = put_many(store, 40)
    last = written[-1]
    crash(store)
    # A SIGKILL leaves the segment the allocator had prepared ahead: right size, zeros.
    ahead = harness.segment_path(SEGMENT_BYTES)
    if not ahead.exists():
        create_empty_segment(ahead)
    tear(harness.segment_path(0), last, "zero-second-half")

    store = harness.open()
    report = report_of(store)
    assert report.corruption == []
    assert report.torn_tail_offset == last.offset
    assert store.segments.max_offset == last.offset
    # The later segment is removed, or kept empty.
    assert not ahead.exists() or is_zero(ahead.read_bytes())
    assert all(s.wrote == 0 for s in store.segments.segments[1:])
    (again,) = put(store, [message(last.topic, last.queue_id, b"y")])
    assert again.offset == last.offset


def test_torn_first_record_of_a_segment(harness: Harness) -> None:
    """The record that rolled into segment 1 is torn: the end is segment 1's start, after
    segment 0's blank marker."""
    store = harness.open()
    written = fill_segments(store, 1)
    written += put(store, [message("Fill", 0, body_for(999, 1000))])
    first_of_1 = written[-1]
    assert first_of_1.offset == SEGMENT_BYTES
    crash(store)
    tear(harness.segment_path(SEGMENT_BYTES), first_of_1, "garbage-second-half")

    store = harness.open()
    report = report_of(store)
    assert report.corruption == []
    assert report.torn_tail_offset == SEGMENT_BYTES
    assert report.end_offset == SEGMENT_BYTES
    assert store.segments.max_offset == SEGMENT_BYTES
    assert is_zero(harness.segment_path(SEGMENT_BYTES).read_bytes())
    assert len(read_all(store)) == len(written) - 1
    (again,) = put(store, [message("Fill", 0, b"z")])
    assert again.offset == SEGMENT_BYTES
    assert again.queue_offset == first_of_1.queue_offset


def test_valid_record_in_a_later_segment_after_an_invalid_one_is_corruption(
    harness: Harness,
) -> None:
    store = harness.open()
    written = fill_segments(store, 1)
    in_1 = put_many(store, 5, topics=("Later",), body_bytes=1000)
    assert in_1[0].offset == SEGMENT_BYTES
    victim = written[-1]  # the last record of segment 0, just before its blank marker
    crash(store, durable=True)
    tear(harness.segment_path(0), victim, "zero-second-half")

    store = harness.open()
    report = report_of(store)
    assert report.torn_tail_offset is None
    # What follows the victim is the segment's blank marker, then segment 1's records.
    assert any(
        str(victim.offset) in text and "blank marker follows" in text for text in report.corruption
    ), report.corruption
    assert report.end_offset == victim.offset
    assert store.segments.max_offset == victim.offset
    assert [s.start_offset for s in store.segments.segments] == [0]
    # Segment 1's records are gone (the allocator may already have prepared a fresh,
    # all-zero segment 1 for the next roll).
    later = harness.segment_path(SEGMENT_BYTES)
    assert not later.exists() or not any(later.read_bytes())
    assert store.commitlog.offsets.next_offsets == next_offsets_of(written[:-1])


def test_torn_tail_below_the_durable_offset_is_corruption(harness: Harness) -> None:
    """After a clean close the snapshot records everything as flushed: a damaged last
    record was durable, so it is corruption, not a torn write."""
    store = harness.open()
    written = put_many(store, 30)
    store.close()
    last = written[-1]
    tear(harness.segment_path(0), last, "zero-second-half")

    store = harness.open()
    report = report_of(store)
    assert report.torn_tail_offset is None
    assert any(str(last.offset) in text for text in report.corruption), report.corruption
    assert store.segments.max_offset == last.offset


def test_zeroed_durable_tail_is_reported(harness: Harness) -> None:
    """Records below the durable offset that read back as zeros were lost by the disk
    (a flushed, acknowledged write is gone). Recovery must not call that a clean end.

    Fails today: recovery.py _classify_stop only reports a stop below the durable
    offset when the scanner gave a reason, and zeros (ScanKind.END) have none."""
    store = harness.open()
    written = put_many(store, 30)
    store.close()
    lost = written[-3:]
    patch_file(harness.segment_path(0), lost[0].offset, bytes(sum(w.size for w in lost)))

    store = harness.open()
    report = report_of(store)
    assert store.segments.max_offset == lost[0].offset
    assert any(str(lost[0].offset) in text for text in report.corruption), report


@pytest.mark.parametrize("how", ["corruption", "torn"])
def test_recovery_reports_the_bytes_it_cut(harness: Harness, how: str) -> None:
    """``recovery_truncated_bytes`` (exported as StorageStatus.recovery_truncated_bytes)
    must count the bytes recovery threw away.

    Fails today: SegmentQueue.truncate counts ``segment.wrote - position``, but at
    recovery the segment holding the end (and every later one) still has wrote == 0,
    so the count is always 0."""
    store = harness.open()
    written = put_many(store, 40)
    old_max = store.segments.max_offset
    crash(store)
    victim = written[20] if how == "corruption" else written[-1]
    if how == "corruption":
        flip_body_byte(harness.segment_path(0), victim)
    else:
        tear(harness.segment_path(0), victim, "garbage-second-half")

    store = harness.open()
    assert store.segments.max_offset == victim.offset
    # Counted up to the last non-zero byte: a record without properties ends with its
    # 2-byte zero properties length, which cannot be told from the zeros after it.
    assert old_max - victim.offset - 2 <= store.recovery_truncated_bytes <= old_max - victim.offset


# -- where abnormal recovery starts --------------------------------------------------------


@pytest.mark.parametrize(
    ("checkpoint_of", "start_index"),
    [
        (lambda stamps: 0, 0),  # zero checkpoint: the first segment
        (lambda stamps: stamps[0] + 2_999, 0),  # nothing old enough: the first segment
        (lambda stamps: stamps[2] + 2_999, 1),
        (lambda stamps: stamps[2] + 3_000, 2),
        (lambda stamps: stamps[3] + 3_000, 3),
        (lambda stamps: stamps[3] + 10 * HOUR_MS, 3),
    ],
    ids=["zero", "too-new", "just-short-of-2", "exactly-2", "last", "far-future"],
)
def test_abnormal_start_segment_from_the_checkpoint(
    harness: Harness, checkpoint_of: Callable[[list[int]], int], start_index: int
) -> None:
    """Abnormal recovery starts at the newest segment whose first record was stored at
    least 3 s before the checkpoint's time; the queue offsets of the segments before it
    are still replayed."""
    base = 1_700_000_000_000
    stamps = [base + k * HOUR_MS for k in range(4)]
    clock = [stamps[0]]

    def on_roll(k: int) -> None:
        clock[0] = stamps[k]

    store = harness.open(clock_ms=lambda: clock[0])
    early = put(store, [message("Early", q, b"only in segment 0") for q in range(4)])
    written = early + fill_segments(store, 3, on_roll=on_roll)
    on_roll(3)
    written += put_many(store, 5, topics=("Tail",), body_bytes=1000)
    starts = [s.start_offset for s in store.segments.segments]
    assert len(starts) == 4
    by_offset = {r.physical_offset: r for r in read_all(store)}
    assert [by_offset[s].store_timestamp_ms for s in starts] == stamps
    max_offset = store.segments.max_offset
    crash(store)
    write_checkpoint(harness.store_dir, checkpoint_of(stamps))

    store = harness.open()
    report = report_of(store)
    assert report.mode == "abnormal"
    assert report.start_offset == starts[start_index]
    assert report.end_offset == max_offset
    assert report.corruption == []
    expected = next_offsets_of(written)
    assert expected[("Early", 3)] == 1
    assert store.commitlog.offsets.next_offsets == expected
    assert_continues(store, expected)


# -- the queue offset snapshot -------------------------------------------------------------


@pytest.mark.parametrize("how", ["clean", "crash"])
def test_queue_offsets_rebuilt_by_scan_without_a_snapshot(harness: Harness, how: str) -> None:
    store = harness.open()
    early = put(store, [message("Early", q, body_for(q, 300)) for q in range(4)])
    written = early + put_many(store, 450)
    starts = [s.start_offset for s in store.segments.segments]
    assert len(starts) >= 5
    expected = dict(store.commitlog.offsets.next_offsets)
    assert expected == next_offsets_of(written)
    stop(store, how)
    remove_snapshot(harness.store_dir)
    if how == "crash":
        # A recent checkpoint: verification starts at the last segment, so the queue
        # offsets of the earlier ones come from the replay, not the verifying scan.
        write_checkpoint(harness.store_dir, int(time.time() * 1000) + HOUR_MS)

    store = harness.open()
    report = report_of(store)
    assert not report.snapshot_used
    assert report.start_offset == (starts[-3] if how == "clean" else starts[-1])
    assert report.start_offset > 0
    assert store.commitlog.offsets.next_offsets == expected
    assert_continues(store, expected)


@pytest.mark.parametrize("how", ["clean", "crash"])
def test_snapshot_past_the_recovered_end_is_ignored(harness: Harness, how: str) -> None:
    store = harness.open()
    written = put_many(store, 200)
    end = store.segments.max_offset
    expected = next_offsets_of(written)
    stop(store, how)
    bogus = {key: n + 50 for key, n in expected.items()}
    bogus[("Ghost", 0)] = 7
    write_snapshot(harness.store_dir, Snapshot(end + 10_000, end + 10_000, bogus))

    store = harness.open()
    report = report_of(store)
    assert not report.snapshot_used
    assert report.end_offset == end
    assert store.commitlog.offsets.next_offsets == expected
    assert_continues(store, expected)


def test_snapshot_is_used_by_abnormal_recovery(harness: Harness) -> None:
    store = harness.open()
    first = put_many(store, 120)
    store.close()
    store = harness.open()
    more = put_many(store, 120, start=120, topics=("TopicA", "TopicC"))
    crash(store)

    store = harness.open()
    report = report_of(store)
    assert report.mode == "abnormal"
    assert report.snapshot_used
    expected = next_offsets_of(first + more)
    assert store.commitlog.offsets.next_offsets == expected
    assert_continues(store, expected)


def test_unreadable_snapshot_falls_back_to_a_scan(harness: Harness) -> None:
    store = harness.open()
    written = put_many(store, 100)
    store.close()
    remove_snapshot(harness.store_dir)
    (harness.store_dir / SNAPSHOT_FILE).write_text('{"commitlogOffset": ')

    store = harness.open()
    assert not report_of(store).snapshot_used
    expected = next_offsets_of(written)
    assert store.commitlog.offsets.next_offsets == expected
    assert_continues(store, expected)


def test_stale_snapshot_after_a_cut_is_not_trusted(harness: Harness) -> None:
    """A recovery that cuts the log below the snapshot leaves that snapshot on disk. If
    the store crashes before it writes a new one, and the new appends passed the old
    snapshot's offset, the next recovery takes the stale snapshot for good and its queue
    offsets (which count the records that were cut) win: queue offsets jump.

    Fails today: MessageStore._open_locked does not rewrite or remove queue_offsets.json
    after recovery truncated below it."""
    store = harness.open()
    first = put_many(store, 60, topics=("TopicA",), queues=1)
    snapshot_offset = store.segments.max_offset
    store.close()
    victim = first[10]
    flip_body_byte(harness.segment_path(0), victim)

    store = harness.open()
    assert report_of(store).end_offset == victim.offset
    assert store.commitlog.offsets.next_offsets == {("TopicA", 0): 10}
    second = put(store, [message("TopicA", 0, body_for(i, 8000)) for i in range(6)])
    assert [w.queue_offset for w in second] == list(range(10, 16))
    assert store.segments.max_offset > snapshot_offset
    crash(store)  # before any periodic snapshot

    store = harness.open()
    assert report_of(store).corruption == []
    assert_contiguous_queue_offsets(read_all(store))
    assert store.commitlog.offsets.next_offsets == {("TopicA", 0): 16}


# -- empty stores -------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["clean", "crash"])
def test_empty_store_recovery(harness: Harness, how: str) -> None:
    store = harness.open()
    assert report_of(store).end_offset == 0
    # The first segment is prepared at open, still empty.
    assert [(s.start_offset, s.wrote) for s in store.segments.segments] == [(0, 0)]
    stop(store, how)

    store = harness.open()
    report = report_of(store)
    assert report.mode == ("normal" if how == "clean" else "abnormal")
    assert (report.start_offset, report.end_offset) == (0, 0)
    assert report.corruption == []
    assert report.torn_tail_offset is None
    assert store.segments.max_offset == 0
    assert store.commitlog.offsets.next_offsets == {}
    (w,) = put(store, [message("First", 0, b"hello")])
    assert (w.offset, w.queue_offset) == (0, 0)


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
def test_only_segment_all_zeros(harness: Harness, abnormal: bool) -> None:
    harness.commitlog_dir.mkdir(parents=True)
    create_empty_segment(harness.segment_path(0))
    if abnormal:
        harness.abort_path.touch()

    store = harness.open()
    report = report_of(store)
    assert report.mode == ("abnormal" if abnormal else "normal")
    assert (report.start_offset, report.end_offset) == (0, 0)
    assert report.corruption == []
    assert report.torn_tail_offset is None
    assert [s.start_offset for s in store.segments.segments] == [0]
    assert store.segments.max_offset == 0
    (w,) = put(store, [message("First", 1, b"hello")])
    assert (w.offset, w.queue_offset) == (0, 0)
    store.close()
    store = harness.open()
    assert [r.body for r in read_all(store)] == [b"hello"]

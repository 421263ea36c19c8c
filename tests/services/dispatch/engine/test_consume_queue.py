"""ConsumeQueue: layout on disk, idempotent puts, padding, recovery, truncation, retention."""

from __future__ import annotations

import os
import random
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from services.dispatch.engine.consume_queue import (
    ALLOC_SUFFIX,
    MAX_GET_ENTRIES,
    MAX_PAD_SEGMENTS,
    ConsumeQueue,
    ConsumeQueueChangedError,
    ConsumeQueueConflictError,
    ConsumeQueueCorruptError,
    ConsumeQueueError,
    ConsumeQueueOrderError,
    Entry,
    Recovered,
)
from tests._smaps import evict
from tide.format import (
    ENTRY_BYTES,
    PRE_BLANK_ENTRY,
    PRE_BLANK_SIZE,
    ConsumeQueueEntry,
    first_unwritten,
    iter_entries,
    pack_entries,
    select_spans,
    unpack_entry,
)
from tide.mapped import MappedFile

EPS = 10  # entries per segment
SEG = EPS * 20  # segment bytes
SIZE = 100  # record size used by the helpers: entry n points at commitlog n * 100
RAW = struct.Struct(">qiq")


def open_queue(root: Path, topic: str = "TopicA", queue_id: int = 0) -> ConsumeQueue:
    queue = ConsumeQueue(root, topic, queue_id, EPS)
    queue.load()
    queue.recover()
    return queue


def reopen(queue: ConsumeQueue, root: Path) -> tuple[ConsumeQueue, Recovered]:
    queue.close()
    again = ConsumeQueue(root, queue.topic, queue.queue_id, EPS)
    again.load()
    return again, again.recover()


def queue_dir(root: Path) -> Path:
    return root / "consumequeue" / "TopicA" / "0"


def names(root: Path) -> list[str]:
    return sorted(p.name for p in queue_dir(root).iterdir())


def file_bytes(root: Path, start: int) -> bytes:
    return (queue_dir(root) / f"{start:020d}").read_bytes()


def fill(queue: ConsumeQueue, first: int, end: int) -> None:
    for n in range(first, end):
        assert queue.put(n, n * SIZE, SIZE, n)


def test_entries_are_big_endian_20_byte_records_at_n_times_20(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    assert queue.put(0, 5000, 115, 2598919)  # the worked example of docs/formats.md
    assert queue.put(1, 5115, 200, -1)
    assert queue.put(2, 2**40, 7, 0)
    data = file_bytes(tmp_path, 0)
    assert len(data) == SEG
    assert data[:20].hex() == "0000000000001388" + "00000073" + "000000000027a807"
    assert RAW.unpack_from(data, 20) == (5115, 200, -1)
    assert data[20:40].hex() == "00000000000013fb" + "000000c8" + "ff" * 8
    assert unpack_entry(data, 40) == ConsumeQueueEntry(2**40, 7, 0)
    assert data[60:] == bytes(SEG - 60)
    assert queue.get(0, 3) == [
        Entry(0, 5000, 115, 2598919),
        Entry(1, 5115, 200, -1),
        Entry(2, 2**40, 7, 0),
    ]
    queue.close()


def test_segments_roll_and_are_named_by_start_byte_offset(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)
    assert names(tmp_path) == [
        "00000000000000000000",
        "00000000000000000200",
        "00000000000000000400",
    ]
    assert all((queue_dir(tmp_path) / n).stat().st_size == SEG for n in names(tmp_path))
    assert RAW.unpack_from(file_bytes(tmp_path, 200), 0) == (1000, SIZE, 10)
    assert RAW.unpack_from(file_bytes(tmp_path, 400), 80) == (2400, SIZE, 24)
    assert file_bytes(tmp_path, 400)[100:] == bytes(100)
    assert (queue.min_offset, queue.max_offset, queue.segment_count) == (0, 25, 3)
    assert queue.max_commitlog_end == 2500
    queue.close()


def test_reput_of_the_same_entry_writes_nothing(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 3)
    before = file_bytes(tmp_path, 0)
    assert queue.put(1, 100, SIZE, 999) is False  # tags are not compared
    assert file_bytes(tmp_path, 0) == before
    assert queue.max_offset == 3
    queue.close()


def test_reput_of_a_different_entry_is_a_conflict(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 3)
    with pytest.raises(
        ConsumeQueueConflictError,
        match=r"offset 1 holds commitlog offset 100 size 100.*offset 150 size 100",
    ):
        queue.put(1, 150, SIZE, 1)
    with pytest.raises(ConsumeQueueConflictError, match="size 99"):
        queue.put(2, 200, 99, 2)
    assert queue.get(1, 1) == [Entry(1, 100, SIZE, 1)]
    queue.close()


def test_reput_into_a_deleted_segment_is_ignored(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 15)
    assert queue.delete_below(1000) == 1
    assert queue.put(3, 12345, 1, 0) is False  # cannot be checked any more
    assert queue.max_offset == 15
    queue.close()


def test_first_put_mid_segment_fills_pre_blanks_and_sets_min_offset(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    assert queue.put(13, 7000, 50, 0)
    assert names(tmp_path) == ["00000000000000000200"]
    data = file_bytes(tmp_path, 200)
    assert data[:60] == PRE_BLANK_ENTRY * 3
    assert RAW.unpack_from(data, 0) == (0, 0x7FFFFFFF, 0)
    assert RAW.unpack_from(data, 60) == (7000, 50, 0)
    assert (queue.min_offset, queue.max_offset, queue.max_commitlog_end) == (13, 14, 7050)
    assert queue.get(10, 5) == []  # below min_offset
    assert queue.get(13, 5) == [Entry(13, 7000, 50, 0)]
    queue.close()


def test_gap_in_a_queue_is_padded_across_segments(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 3)
    assert queue.put(25, 2500, SIZE, 25)
    assert names(tmp_path) == [
        "00000000000000000000",
        "00000000000000000200",
        "00000000000000000400",
    ]
    assert file_bytes(tmp_path, 0)[60:] == PRE_BLANK_ENTRY * 7
    assert file_bytes(tmp_path, 200) == PRE_BLANK_ENTRY * 10
    assert file_bytes(tmp_path, 400)[:100] == PRE_BLANK_ENTRY * 5
    assert (queue.min_offset, queue.max_offset) == (0, 26)
    entries = queue.get(0, 100)
    assert [e.queue_offset for e in entries] == list(range(26))
    assert [e.queue_offset for e in entries if not e.is_pre_blank] == [0, 1, 2, 25]
    assert queue.search_first(lambda e: e.commitlog_offset >= 300) == 25
    assert queue.search_first(lambda e: e.commitlog_offset >= 100) == 1
    assert queue.search_first(lambda e: e.commitlog_offset >= 2501) is None
    queue.close()


def test_too_wide_a_gap_is_refused_without_creating_files(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 1)
    with pytest.raises(ConsumeQueueOrderError, match="padding the gap would create"):
        queue.put(EPS * (MAX_PAD_SEGMENTS + 1), 10_000, SIZE, 0)
    assert names(tmp_path) == ["00000000000000000000"]
    assert queue.max_offset == 1
    queue.close()


def test_commitlog_offset_going_back_is_refused(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 2)  # the last record ends at 200
    with pytest.raises(ConsumeQueueOrderError, match="ends at 200"):
        queue.put(2, 150, SIZE, 0)
    assert queue.max_offset == 2
    queue.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 0, 1, 0), "queue offset"),
        ((0, -1, 1, 0), "commitlog offset"),
        ((0, 0, 0, 0), "size 0"),
        ((0, 0, PRE_BLANK_SIZE, 0), "size"),
        ((0, 0, 1, 2**63), "tags code"),
    ],
)
def test_put_arguments_are_checked(
    tmp_path: Path, args: tuple[int, int, int, int], message: str
) -> None:
    queue = open_queue(tmp_path)
    with pytest.raises(ValueError, match=message):
        queue.put(*args)
    assert queue.max_offset == 0
    queue.close()


def test_queue_must_be_recovered_before_writing(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path, "TopicA", 0, EPS)
    queue.load()
    with pytest.raises(ConsumeQueueError, match="recover"):
        queue.put(0, 0, 1, 0)
    queue.recover()
    queue.close()
    with pytest.raises(ConsumeQueueError, match="closed"):
        queue.put(0, 0, 1, 0)
    assert queue.get(0, 1) == []


def test_bad_names_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="contains"):
        ConsumeQueue(Path("/nonexistent"), "bad/topic", 0)
    with pytest.raises(ValueError, match="queue id"):
        ConsumeQueue(Path("/nonexistent"), "T", -1)
    with pytest.raises(ValueError, match="entries per segment"):
        ConsumeQueue(Path("/nonexistent"), "T", 0, 0)


# -- recovery --------------------------------------------------------------------------


def test_clean_reopen_recovers_every_position(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)
    assert queue.flush(0)
    queue, recovered = reopen(queue, tmp_path)
    assert recovered == Recovered(25, 2500)
    assert (queue.min_offset, queue.max_offset, queue.segment_count) == (0, 25, 3)
    assert queue.get(8, 4) == [Entry(n, n * SIZE, SIZE, n) for n in range(8, 12)]
    assert queue.put(25, 2500, SIZE, 25)
    assert RAW.unpack_from(file_bytes(tmp_path, 400), 100) == (2500, SIZE, 25)
    queue.close()


def test_reopen_of_a_queue_that_starts_mid_segment(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    assert queue.put(13, 7000, 50, 0)
    queue, recovered = reopen(queue, tmp_path)
    assert recovered == Recovered(14, 7050)  # not PRE_BLANK's 0 + 0x7fffffff
    assert (queue.min_offset, queue.max_offset) == (13, 14)
    queue.close()


def test_crash_with_a_half_written_entry(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 15)
    queue.close()  # no flush: the crash is simulated on the file
    path = queue_dir(tmp_path) / f"{200:020d}"
    data = bytearray(path.read_bytes())
    data[80 + 8 : 100] = bytes(12)  # entry 14: offset on disk, size and tags not
    path.write_bytes(bytes(data))
    queue, recovered = reopen(queue, tmp_path)
    assert recovered == Recovered(14, 1400)
    assert file_bytes(tmp_path, 200)[80:] == bytes(SEG - 80)  # the torn half is zeroed
    assert queue.put(14, 1400, 30, 0)  # a different entry 14 is no conflict
    assert queue.get(13, 5) == [Entry(13, 1300, SIZE, 13), Entry(14, 1400, 30, 0)]
    queue.close()


def test_crash_with_a_hole_drops_what_follows(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)
    queue.close()
    path = queue_dir(tmp_path) / f"{200:020d}"
    data = bytearray(path.read_bytes())
    data[40:60] = bytes(20)  # entry 12 never reached the disk, 13.. did
    path.write_bytes(bytes(data))
    queue, recovered = reopen(queue, tmp_path)
    assert recovered == Recovered(12, 1200)
    assert names(tmp_path) == ["00000000000000000000", "00000000000000000200"]
    assert file_bytes(tmp_path, 200)[40:] == bytes(SEG - 40)
    queue, recovered = reopen(queue, tmp_path)  # and it stays that way
    assert recovered == Recovered(12, 1200)
    queue.close()


def test_recovery_looks_at_the_last_three_segments_only(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 45)  # five segments
    queue.close()
    path = queue_dir(tmp_path) / f"{0:020d}"
    data = bytearray(path.read_bytes())
    data[0:20] = bytes(20)  # RocketMQ's recover() never reads the first segments
    path.write_bytes(bytes(data))
    queue, recovered = reopen(queue, tmp_path)
    assert recovered == Recovered(45, 4500)
    assert queue.segment_count == 5
    queue.close()


def test_recovery_of_empty_and_all_zero_segments(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    assert (queue.min_offset, queue.max_offset, queue.max_commitlog_end) == (0, 0, 0)
    fill(queue, 0, 10)  # segment 0 full
    assert queue.put(10, 1000, SIZE, 0)
    queue.close()
    path = queue_dir(tmp_path) / f"{200:020d}"
    path.write_bytes(bytes(SEG))
    queue, recovered = reopen(queue, tmp_path)
    assert recovered == Recovered(10, 1000)
    assert queue.segment_count == 2  # kept, empty, as RocketMQ does
    assert queue.put(10, 1000, SIZE, 0)
    queue.close()


def test_load_refuses_gaps_and_wrong_sizes(tmp_path: Path) -> None:
    directory = queue_dir(tmp_path)
    directory.mkdir(parents=True)
    (directory / f"{0:020d}").write_bytes(bytes(SEG))
    (directory / f"{400:020d}").write_bytes(bytes(SEG))
    with pytest.raises(
        ConsumeQueueCorruptError, match=r"00000000000000000000 is followed by 00000000000000000400"
    ):
        ConsumeQueue(tmp_path, "TopicA", 0, EPS).load()
    (directory / f"{400:020d}").unlink()
    (directory / f"{200:020d}").write_bytes(bytes(SEG - 1))
    with pytest.raises(ConsumeQueueCorruptError, match="00000000000000000200 is 199 bytes"):
        ConsumeQueue(tmp_path, "TopicA", 0, EPS).load()
    (directory / f"{200:020d}").unlink()
    (directory / f"{100:020d}").write_bytes(bytes(SEG))
    with pytest.raises(ConsumeQueueCorruptError, match="00000000000000000100: start offset 100"):
        ConsumeQueue(tmp_path, "TopicA", 0, EPS).load()


def test_load_removes_half_created_segments_and_ignores_junk(tmp_path: Path) -> None:
    directory = queue_dir(tmp_path)
    directory.mkdir(parents=True)
    (directory / f"{0:020d}").write_bytes(RAW.pack(0, 10, 0) + bytes(SEG - 20))
    (directory / (f"{200:020d}" + ALLOC_SUFFIX)).write_bytes(bytes(7))
    (directory / "notes.txt").write_text("junk")
    queue = ConsumeQueue(tmp_path, "TopicA", 0, EPS)
    queue.load()
    assert queue.recover() == Recovered(1, 10)
    assert names(tmp_path) == ["00000000000000000000", "notes.txt"]
    queue.close()


# -- truncation ------------------------------------------------------------------------


def test_truncate_past_zeros_entries_and_deletes_later_segments(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)
    assert queue.truncate_past(1300) == 12
    assert (queue.max_offset, queue.max_commitlog_end) == (13, 1300)
    assert names(tmp_path) == ["00000000000000000000", "00000000000000000200"]
    assert file_bytes(tmp_path, 200)[60:] == bytes(SEG - 60)
    assert queue.get(12, 5) == [Entry(12, 1200, SIZE, 12)]
    queue, recovered = reopen(queue, tmp_path)
    assert recovered == Recovered(13, 1300)
    assert queue.put(13, 1300, 40, 0)  # the commitlog's new record 13
    queue.close()


def test_truncate_at_a_segment_start_deletes_that_segment(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)
    assert queue.truncate_past(1000) == 15
    assert names(tmp_path) == ["00000000000000000000"]
    assert (queue.max_offset, queue.segment_count) == (10, 1)
    assert queue.truncate_past(5000) == 0
    assert queue.put(10, 1000, SIZE, 0)
    assert names(tmp_path) == ["00000000000000000000", "00000000000000000200"]
    queue.close()


def test_truncate_of_everything_leaves_an_empty_queue(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 15)
    assert queue.truncate_past(0) == 15
    assert names(tmp_path) == []
    assert (queue.min_offset, queue.max_offset, queue.max_commitlog_end) == (0, 0, 0)
    fill(queue, 0, 2)
    queue, recovered = reopen(queue, tmp_path)
    assert recovered == Recovered(2, 200)
    queue.close()


def test_truncate_keeps_pre_blanks_and_last_entry_skips_them(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 3)
    assert queue.put(8, 800, SIZE, 0)  # pads 3..7
    assert queue.truncate_past(800) == 1
    assert (queue.min_offset, queue.max_offset, queue.max_commitlog_end) == (0, 8, 300)
    assert file_bytes(tmp_path, 0)[60:160] == PRE_BLANK_ENTRY * 5
    assert file_bytes(tmp_path, 0)[160:] == bytes(40)
    assert queue.last_entry() == Entry(2, 200, SIZE, 2)
    queue, recovered = reopen(queue, tmp_path)
    assert recovered == Recovered(8, 300)
    queue.close()


def test_truncate_of_a_queue_that_starts_mid_segment(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    assert queue.put(13, 500, SIZE, 0)
    assert queue.truncate_past(500) == 1
    assert (queue.min_offset, queue.max_offset, queue.max_commitlog_end) == (13, 13, 0)
    assert queue.last_entry() is None
    assert queue.put(13, 500, 60, 0)
    assert queue.get(13, 1) == [Entry(13, 500, 60, 0)]
    queue.close()


# -- retention -------------------------------------------------------------------------


def test_delete_below_deletes_segments_and_corrects_min_offset(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)
    assert queue.delete_below(1050) == 1  # segment 0 ends at 900, segment 200 at 1900
    assert names(tmp_path) == ["00000000000000000200", "00000000000000000400"]
    assert queue.min_offset == 11
    assert queue.get(10, 1) == []
    assert queue.entry_at(11) == Entry(11, 1100, SIZE, 11)
    queue, _ = reopen(queue, tmp_path)
    assert queue.min_offset == 10  # recovery knows nothing of the commitlog
    assert queue.delete_below(1050) == 0
    assert queue.min_offset == 11
    queue.close()


def test_delete_below_moves_the_min_before_the_segments_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader between the two steps never sees a min whose entry is gone (a dispatch
    reported such a min to GetQueueOffsets; GetQueueEntries there found nothing)."""
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)
    seen: list[tuple[int, Entry | None]] = []
    drop = queue._drop_segments

    def observed_drop(segments: list[MappedFile]) -> None:
        seen.append((queue.min_offset, queue.entry_at(queue.min_offset)))
        drop(segments)

    monkeypatch.setattr(queue, "_drop_segments", observed_drop)
    assert queue.delete_below(1050) == 1
    assert seen == [(11, Entry(11, 1100, SIZE, 11))]
    queue.close()


def test_a_pass_given_the_same_min_over_the_same_segments_reads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cleanup runs every few seconds and the storage's min moves only when its
    retention deletes: a pass with nothing new does not read entries (which would bring
    a cold queue's pages back each time)."""
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)
    reads = 0
    read_run = queue._read_run

    def counted(segments: list[MappedFile], queue_offset: int, count: int) -> bytes | None:
        nonlocal reads
        reads += 1
        return read_run(segments, queue_offset, count)

    monkeypatch.setattr(queue, "_read_run", counted)
    assert queue.delete_below(1050) == 1
    assert reads > 0 and queue.min_offset == 11
    reads = 0
    assert queue.delete_below(1050) == 0
    assert reads == 0
    assert queue.delete_below(1150) == 0  # another min: looked at again
    assert reads > 0 and queue.min_offset == 12
    queue.close()


def test_a_new_segment_makes_the_pass_look_again(tmp_path: Path) -> None:
    """A new segment makes the one before it deletable under the same min: that counts
    as something new for the pass."""
    queue = open_queue(tmp_path)
    fill(queue, 0, 10)  # one full segment, its entries at 0..900
    assert queue.delete_below(1000) == 0  # every entry below, but never the last segment
    assert queue.min_offset == 10
    fill(queue, 10, 12)  # a second segment: the first may go now
    assert queue.delete_below(1000) == 1
    assert names(tmp_path) == ["00000000000000000200"]
    queue.close()


def test_delete_below_never_deletes_the_last_segment(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)
    assert queue.delete_below(10**9) == 2
    assert names(tmp_path) == ["00000000000000000400"]
    assert (queue.min_offset, queue.max_offset) == (25, 25)
    assert queue.get(24, 1) == []
    assert queue.max_commitlog_end == 2500  # still covered: dispatch resumes past it
    assert queue.delete_below(0) == 0
    assert queue.min_offset == 25  # never backwards
    queue.close()


def test_min_offset_is_never_a_pre_blank(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    assert queue.put(13, 0, SIZE, 0)
    assert queue.delete_below(0) == 0
    assert queue.min_offset == 13


# -- reading and flushing --------------------------------------------------------------


def test_get_is_bounded(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)
    assert [e.queue_offset for e in queue.get(5, 10)] == list(range(5, 15))
    assert [e.queue_offset for e in queue.get(20, 100)] == list(range(20, 25))
    assert queue.get(25, 1) == []
    assert queue.entry_at(25) is None
    with pytest.raises(ValueError, match="max count"):
        queue.get(0, 0)
    with pytest.raises(ValueError, match="max count"):
        queue.get(0, MAX_GET_ENTRIES + 1)
    queue.close()


def test_get_stops_at_an_entry_zeroed_under_it(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 5)
    path = queue_dir(tmp_path) / f"{0:020d}"
    with path.open("r+b") as f:  # as a truncation racing the reader would
        f.seek(60)
        f.write(bytes(20))
    assert [e.queue_offset for e in queue.get(0, 5)] == [0, 1, 2]
    queue.close()


def test_get_retries_a_read_that_a_truncation_overlapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 5)
    read_run = queue._read_run
    calls = 0

    def racing(segments: list[MappedFile], offset: int, count: int) -> bytes | None:
        nonlocal calls
        calls += 1
        data = read_run(segments, offset, count)
        if calls == 1:  # the reader copied entries 0..4, then the writer truncates
            assert queue.truncate_past(300) == 2
        return data

    monkeypatch.setattr(queue, "_read_run", racing)
    assert [e.queue_offset for e in queue.get(0, 5)] == [0, 1, 2]
    queue.close()


def test_search_racing_truncation_or_retention_asks_for_a_retry(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)
    pending: list[Callable[[], int]] = []

    def racing(entry: Entry) -> bool:
        if pending:  # the writer runs while the reader is half-way
            pending.pop()()
        return entry.commitlog_offset >= 100

    pending.append(lambda: queue.truncate_past(2400))
    with pytest.raises(ConsumeQueueChangedError, match="truncated meanwhile"):
        queue.search_first(racing)
    pending.append(lambda: queue.delete_below(1500))
    with pytest.raises(ConsumeQueueChangedError, match="deleted meanwhile"):
        queue.search_first(racing)
    assert queue.search_first(racing) == 15  # min offset after retention
    assert queue.last_entry() == Entry(23, 2300, SIZE, 23)
    queue.close()


def test_flush_syncs_dirty_segments_by_policy(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    assert queue.flush(0) is False  # nothing written
    fill(queue, 0, 5)
    assert queue.flush(2) is False  # 100 dirty bytes, not two pages
    assert queue.flush(0) is True
    assert queue.flush(0) is False
    fill(queue, 5, 12)
    assert queue.flush(2) is True  # a full segment is synced whatever its dirty size
    assert queue.flush(2) is False  # the second one has 40 dirty bytes
    assert queue.flush(0) is True
    queue.close()
    assert queue.flush(0) is False


def test_readers_see_only_whole_entries_while_the_writer_runs(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    done = threading.Event()
    bad: list[Entry] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not done.is_set():
            start = queue.min_offset
            for entry in queue.get(start, 50):
                reads += 1
                if entry != Entry(
                    entry.queue_offset, entry.queue_offset * SIZE, SIZE, entry.queue_offset
                ):
                    bad.append(entry)
            time.sleep(0)  # let the writer have the GIL

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for n in range(400):
            assert queue.put(n, n * SIZE, SIZE, n)
            if n % 50 == 49:
                queue.delete_below((n - 20) * SIZE)
    finally:
        done.set()
        thread.join()
    assert bad == []
    assert reads > 0, reads
    assert queue.segment_count <= 4
    queue.close()


def test_first_unwritten_follows_rocketmq_rule() -> None:
    rng = random.Random(7)
    choices = [(5, 100), (0, 1), (-1, 100), (5, 0), (5, -3), (0, PRE_BLANK_SIZE), (2**62, 2**30)]
    for _ in range(300):
        count = rng.randrange(0, 40)
        pairs = [rng.choice(choices[:1] * 8 + choices) for _ in range(count)]
        data = b"".join(RAW.pack(off, size, rng.randrange(-(2**63), 2**63)) for off, size in pairs)
        expected = next(
            (i for i, (off, size) in enumerate(pairs) if not (off >= 0 and size > 0)), count
        )
        assert first_unwritten(data) == expected, pairs


# -- put_run: a run of entries at once, the same bytes as one put each ---------------------


def _segments(root: Path, queue_id: int) -> dict[str, bytes]:
    directory = root / "consumequeue" / "TopicA" / str(queue_id)
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _runs_and_puts(
    tmp_path: Path,
    runs: list[list[tuple[int, int, int, int]]],
    *,
    from_batch: bool = False,
    packed: bool = False,
) -> None:
    """Apply ``runs`` with put_run (``packed``: put_entries_run of the run's bytes) to
    queue 2 and entry by entry with put to queue 1; the files, positions and results
    must be the same (errors included)."""
    one = open_queue(tmp_path, queue_id=1)
    many = open_queue(tmp_path, queue_id=2)
    for run in runs:
        columns = [list(column) for column in zip(*run, strict=True)]
        try:
            want: int | type[Exception] = sum(one.put(*entry) for entry in run)
        except ConsumeQueueError as exc:
            want = type(exc)
        if isinstance(want, int):
            assert _put_run(many, columns, from_batch=from_batch, packed=packed) == want
        else:
            with pytest.raises(want):
                _put_run(many, columns, from_batch=from_batch, packed=packed)
        assert (many.min_offset, many.max_offset, many.max_commitlog_end) == (
            one.min_offset,
            one.max_offset,
            one.max_commitlog_end,
        )
        if isinstance(want, int):
            assert _segments(tmp_path, 2) == _segments(tmp_path, 1)


def _put_run(
    queue: ConsumeQueue, columns: list[list[int]], *, from_batch: bool, packed: bool
) -> int:
    if packed:
        return queue.put_entries_run(columns[0][0], pack_entries(*columns[1:]))
    return queue.put_run(*columns, from_batch=from_batch)


def run_of(first: int, count: int, *, size: int = SIZE) -> list[tuple[int, int, int, int]]:
    return [(n, n * SIZE, size, n * 7 - 50) for n in range(first, first + count)]


def test_put_run_across_segments_is_put_by_put(tmp_path: Path) -> None:
    _runs_and_puts(tmp_path, [run_of(0, 3), run_of(3, 25), run_of(28, 1), run_of(29, 11)])


def test_put_run_from_a_checked_batch(tmp_path: Path) -> None:
    _runs_and_puts(tmp_path, [run_of(0, 13), run_of(13, 40)], from_batch=True)


def test_put_run_redispatch_overlapping_the_end(tmp_path: Path) -> None:
    _runs_and_puts(tmp_path, [run_of(0, 12), run_of(5, 12), run_of(0, 17), run_of(17, 3)])


def test_put_run_starting_mid_segment_and_after_a_gap_pads(tmp_path: Path) -> None:
    _runs_and_puts(tmp_path, [run_of(7, 5), run_of(25, 4)])


def test_put_run_not_consecutive_goes_entry_by_entry(tmp_path: Path) -> None:
    run = [*run_of(0, 3), *run_of(5, 2), *run_of(4, 1)]
    _runs_and_puts(tmp_path, [run])


def test_put_run_conflict_writes_nothing(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 5)
    before = file_bytes(tmp_path, 0)
    run = [*run_of(3, 2), (5, 500, SIZE, 0), (6, 600, SIZE, 0)]
    run[1] = (4, 4 * SIZE + 1, SIZE - 1, 0)  # entry 4 is there, with another offset
    with pytest.raises(ConsumeQueueConflictError):
        queue.put_run(*[list(c) for c in zip(*run, strict=True)])
    assert queue.max_offset == 5
    assert file_bytes(tmp_path, 0) == before


def test_put_run_checks_order_and_arguments(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    overlapping = [(0, 0, SIZE, 0), (1, SIZE - 1, SIZE, 0)]
    with pytest.raises(ConsumeQueueOrderError):
        queue.put_run(*[list(c) for c in zip(*overlapping, strict=True)])
    with pytest.raises(ValueError, match="size"):
        queue.put_run([0, 1], [0, 100], [100, 0], [0, 0])
    assert queue.max_offset == 0
    fill(queue, 0, 2)
    with pytest.raises(ConsumeQueueOrderError):  # before the previous entry's record
        queue.put_run([2, 3], [0, 100], [10, 10], [0, 0])
    assert queue.put_run([], [], [], []) == 0


def test_put_entries_run_is_put_by_put(tmp_path: Path) -> None:
    """A run's entries given as bytes (the dispatch's way): the same files, positions
    and results as one put each, across segments, re-dispatched over the end, after a
    gap (padded) and from mid-segment."""
    runs = [run_of(7, 5), run_of(12, 25), run_of(5, 40), run_of(60, 4), run_of(60, 4)]
    _runs_and_puts(tmp_path, runs, packed=True)


def test_put_entries_run_conflict_writes_nothing(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 5)
    before = file_bytes(tmp_path, 0)
    run = [*run_of(3, 2), (5, 500, SIZE, 0), (6, 600, SIZE, 0)]
    run[1] = (4, 4 * SIZE + 1, SIZE - 1, 0)  # entry 4 is there, with another offset
    _, offsets, sizes, codes = ([*c] for c in zip(*run, strict=True))
    with pytest.raises(ConsumeQueueConflictError):
        queue.put_entries_run(3, pack_entries(offsets, sizes, codes))
    assert queue.max_offset == 5
    assert file_bytes(tmp_path, 0) == before


def test_put_entries_run_checks_its_arguments(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    with pytest.raises(ValueError, match="whole entries"):
        queue.put_entries_run(0, pack_entries([0], [SIZE], [0])[:-1])
    with pytest.raises(ValueError, match="size"):
        queue.put_entries_run(0, pack_entries([0, 100], [100, 0], [0, 0]))
    with pytest.raises(ValueError, match="queue offset"):
        queue.put_entries_run(-1, pack_entries([0], [SIZE], [0]))
    assert queue.put_entries_run(0, b"") == 0
    assert queue.max_offset == 0
    fill(queue, 0, 2)
    with pytest.raises(ConsumeQueueOrderError):  # before the previous entry's record
        queue.put_entries_run(2, pack_entries([0, 100], [10, 10], [0, 0]))
    assert queue.max_offset == 2
    queue.close()


# -- get_bytes: get's entries as their bytes ---------------------------------------------
def get_units(queue: ConsumeQueue, offset: int, count: int) -> list[tuple[int, int, int]]:
    """get_bytes(offset, count), checked to be whole entries, unpacked."""
    data = queue.get_bytes(offset, count)
    assert type(data) is bytes and len(data) % ENTRY_BYTES == 0
    return list(iter_entries(data))


def as_units(entries: list[Entry]) -> list[tuple[int, int, int]]:
    return [(e.commitlog_offset, e.size, e.tags_code) for e in entries]


def check_units(queue: ConsumeQueue, offset: int, count: int) -> list[tuple[int, int, int]]:
    """get_bytes(offset, count), checked to be get's entries, queue offsets from offset."""
    units = get_units(queue, offset, count)
    entries = queue.get(offset, count)
    assert units == as_units(entries)
    assert [e.queue_offset for e in entries] == list(range(offset, offset + len(units)))
    return units


def test_get_bytes_is_get_packed_on_random_queues(tmp_path: Path) -> None:
    """Against get and against a model of what was put (gaps read as PRE_BLANKs)."""
    rng = random.Random(5)
    pre_blank = (0, PRE_BLANK_SIZE, 0)
    pre_blanks = 0
    for case in range(20):
        queue = open_queue(tmp_path, queue_id=case)
        offset, position = rng.randrange(35), 0  # mid-segment: PRE_BLANKs before it
        model: dict[int, tuple[int, int, int]] = {}
        for _ in range(rng.randrange(1, 60)):
            size, code = rng.randrange(1, 500), rng.randrange(-(2**63), 2**63)
            assert queue.put(offset, position, size, code)
            model[offset] = (position, size, code)
            offset += rng.choice((1, 1, 1, 1, 2, 7, 13))  # gaps: PRE_BLANK padding
            position += size + rng.choice((0, 0, 3))
        low, high = queue.min_offset, queue.max_offset
        assert low == min(model) and high == max(model) + 1
        for _ in range(60):
            start = rng.randrange(high + 3)
            count = rng.randrange(1, high + 5)
            expected = []
            if low <= start < high:
                expected = [model.get(n, pre_blank) for n in range(start, min(high, start + count))]
            assert check_units(queue, start, count) == expected
        everything = check_units(queue, low, MAX_GET_ENTRIES)
        assert everything == [model.get(n, pre_blank) for n in range(low, high)]
        pre_blanks += everything.count(pre_blank)
        queue.close()
    assert pre_blanks > 20  # the gaps were padded, and read back as PRE_BLANKs


def test_get_bytes_across_a_segment_boundary(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)  # segments of EPS = 10 entries
    assert check_units(queue, 5, 10) == [(n * SIZE, SIZE, n) for n in range(5, 15)]
    assert check_units(queue, 0, 100) == [(n * SIZE, SIZE, n) for n in range(25)]
    assert check_units(queue, 9, 2) == [(900, SIZE, 9), (1000, SIZE, 10)]
    assert check_units(queue, 10, 10) == [(n * SIZE, SIZE, n) for n in range(10, 20)]
    queue.close()


def test_resident_tells_entries_in_memory_from_entries_on_disk_only(tmp_path: Path) -> None:
    """What the servicer asks before reading entries far behind the end on the loop
    (services/dispatch/servicer.py ``_page_in``): mincore over the entries' segments."""
    eps = 1024  # 20 KiB segments: 5 pages each
    queue = ConsumeQueue(tmp_path, "TopicA", 0, eps)
    queue.load()
    queue.recover()
    fill(queue, 0, 2 * eps)
    assert queue.flush(0)  # written back: clean pages can be taken out of memory
    assert queue.resident(0, 2 * eps)
    evict(os.getpid(), queue_dir(tmp_path) / f"{eps * ENTRY_BYTES:020d}")
    assert queue.resident(0, eps)  # the first segment is still in memory
    assert not queue.resident(eps, 1)
    assert not queue.resident(eps - 10, 20)  # across the boundary: the second is not
    assert queue.resident(2 * eps, 10)  # past the segments: nothing to fetch
    assert len(queue.get_bytes(eps, 32)) == 32 * ENTRY_BYTES  # read: in memory again
    assert queue.resident(eps, 32)
    queue.close()


def test_spans_cross_a_segment_boundary(tmp_path: Path) -> None:
    """The runs of two segments, joined by get_bytes, make one span where their records
    are back to back (fill: entry n at commitlog n * SIZE, tags code n)."""
    queue = open_queue(tmp_path)
    fill(queue, 0, 25)  # segments of EPS = 10 entries
    entries = queue.get_bytes(5, 10)
    assert select_spans(entries, 5, 32, frozenset(), 0, 5) == ([(500, 10 * SIZE, 10)], 15)
    assert select_spans(entries, 5, 32, frozenset({9, 10, 12}), 0, 5) == (
        [(900, 2 * SIZE, 2), (1200, SIZE, 1)],
        15,
    )
    assert select_spans(queue.get_bytes(0, 100), 0, 100, frozenset(), 0, 0) == (
        [(0, 25 * SIZE, 25)],
        25,
    )
    queue.close()


def test_get_bytes_range_rules(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    assert get_units(queue, 0, 1) == []  # empty queue
    assert queue.put(13, 7000, 50, 1)  # PRE_BLANKs at 10..12, below min_offset
    assert queue.put(16, 7050, 60, 2)  # PRE_BLANKs at 14, 15
    assert (queue.min_offset, queue.max_offset) == (13, 17)
    assert check_units(queue, 10, 5) == []  # below min_offset
    assert check_units(queue, 12, 5) == []
    assert check_units(queue, 17, 1) == []  # at max_offset
    assert check_units(queue, 18, 5) == []
    pre_blank = (0, PRE_BLANK_SIZE, 0)
    assert check_units(queue, 13, 5) == [(7000, 50, 1), pre_blank, pre_blank, (7050, 60, 2)]
    assert check_units(queue, 14, 1) == [pre_blank]
    assert check_units(queue, 16, MAX_GET_ENTRIES) == [(7050, 60, 2)]
    for bad in (0, -1, MAX_GET_ENTRIES + 1):
        with pytest.raises(ValueError, match="max count"):
            get_units(queue, 13, bad)
    queue.close()


@pytest.mark.parametrize(
    ("at", "raw"),
    [
        (3, bytes(20)),  # zeroed by a truncation racing the reader
        (3, RAW.pack(-1, SIZE, 0)),  # RocketMQ's rule: offset < 0
        (3, RAW.pack(300, -5, 0)),  # size < 0
        (3, RAW.pack(300, 0, 7)),  # size 0
        (0, bytes(20)),  # the first entry asked for
        (10, bytes(20)),  # the first entry of the second segment
        (14, bytes(20)),  # inside the second segment
    ],
)
def test_get_bytes_stops_at_an_unwritten_entry(tmp_path: Path, at: int, raw: bytes) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 20)
    start, position = divmod(at * 20, SEG)
    with (queue_dir(tmp_path) / f"{start * SEG:020d}").open("r+b") as f:
        f.seek(position)
        f.write(raw)
    expected = [(n * SIZE, SIZE, n) for n in range(at)]
    assert check_units(queue, 0, 20) == expected
    assert check_units(queue, 0, at + 1) == expected
    assert check_units(queue, at, 5) == []
    if at:
        assert check_units(queue, at - 1, 3) == expected[-1:]
    assert check_units(queue, at + 1, 2) == [(n * SIZE, SIZE, n) for n in (at + 1, at + 2)]
    queue.close()


def test_get_bytes_retries_a_read_that_a_truncation_overlapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 15)
    read_run = queue._read_run
    calls = 0

    def racing(segments: list[MappedFile], offset: int, count: int) -> bytes | None:
        nonlocal calls
        calls += 1
        data = read_run(segments, offset, count)
        if calls == 1:  # the reader copied entries 0..9, then the writer truncates
            assert queue.truncate_past(300) == 12
        return data

    monkeypatch.setattr(queue, "_read_run", racing)
    # (Without the retry: entries 0..9 as copied, the second segment gone.)
    assert get_units(queue, 0, 15) == [(0, SIZE, 0), (100, SIZE, 1), (200, SIZE, 2)]
    queue.close()


def test_get_bytes_with_every_read_overlapped_is_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = open_queue(tmp_path)
    fill(queue, 0, 5)
    monkeypatch.setattr(queue, "_truncations", 1)  # a truncation that never ends
    assert get_units(queue, 0, 5) == []
    assert queue.get(0, 5) == []
    queue.close()


@pytest.mark.skipif(not __debug__, reason="the zero check is an assert (python -O skips it)")
def test_a_run_landing_on_a_non_zero_slot_is_refused(tmp_path: Path) -> None:
    """The check before a run's write (a write must land on zeros) still reads the
    disk: a slot that holds bytes it should not is refused, and nothing is written."""
    queue = open_queue(tmp_path)
    fill(queue, 0, 3)
    segment_file = queue_dir(tmp_path) / f"{0:020d}"
    with segment_file.open("r+b") as raw:
        raw.seek(6 * 20 + 19)  # entry 6's last byte: inside the run put below
        raw.write(b"\x01")
    run = range(3, 9)
    with pytest.raises(AssertionError):
        queue.put_run(run, [n * SIZE for n in run], [SIZE] * 6, list(run))
    assert queue.max_offset == 3
    assert file_bytes(tmp_path, 0)[60:120] == bytes(60)  # entries 3-5: not written either
    queue.close()

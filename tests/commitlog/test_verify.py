"""verify(): every record checked, torn tails told apart from corruption."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.commitlog._builder import SEGMENT_SIZE, StoreBuilder, Written
from tide.commitlog import CommitlogLayoutError, verify
from tide.commitlog import _verify as verify_module
from tide.format import HostAddress, TailMarks, segment_name


def _store(tmp_path: Path, count: int = 20) -> StoreBuilder:
    builder = StoreBuilder(tmp_path)
    builder.append_many(count)
    return builder


def _multi_segment(tmp_path: Path) -> StoreBuilder:
    builder = StoreBuilder(tmp_path)
    while builder.pos < 2 * SEGMENT_SIZE + 1000:
        builder.append_many(50)
    return builder


def _break_crc(builder: StoreBuilder, record: Written) -> None:
    body_pos = record.size - len(record.body) - len(record.topic) - 1 - 2
    builder.damage(record.offset + body_pos, b"X")


def test_valid_store(tmp_path: Path) -> None:
    builder = _multi_segment(tmp_path)
    builder.write()
    report = verify(builder.commitlog)
    assert report.valid
    assert report.segments_checked == 4  # three with data, one preallocated
    assert report.segment_size == SEGMENT_SIZE
    assert report.records == len(builder.records)
    assert report.record_bytes == sum(w.size for w in builder.records)
    assert report.blank_markers == 2
    assert report.first_offset == 0
    assert report.last_offset == builder.records[-1].offset
    assert report.last_valid_offset == builder.records[-1].end
    assert report.torn_tail is None
    assert report.corruption == []
    assert report.warnings == []


def test_zero_filled_preallocated_tail_is_normal(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write(preallocate_next=True)
    report = verify(builder.commitlog)
    assert report.valid and report.torn_tail is None
    assert report.segments_checked == 2


def test_record_up_to_the_blank_reserve(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    builder.append()
    builder.fill_to_reserve()
    builder.append()
    builder.write()
    report = verify(builder.commitlog)
    assert report.valid
    assert report.records == 3 and report.blank_markers == 1
    assert report.last_valid_offset == builder.records[-1].end


def test_empty_store(tmp_path: Path) -> None:
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    report = verify(commitlog)
    assert report.valid and report.records == 0 and report.segments_checked == 0
    assert report.first_offset is None and report.last_valid_offset == 0
    (commitlog / segment_name(0)).write_bytes(bytes(SEGMENT_SIZE))
    report = verify(commitlog)
    assert report.valid and report.records == 0 and report.segments_checked == 1
    assert report.torn_tail is None


def test_torn_record_at_the_tail(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    last = builder.records[-1]
    builder.write()
    builder.damage(last.offset + 60, bytes(last.size - 60))
    report = verify(builder.commitlog)
    assert report.valid
    assert report.torn_tail is not None
    assert report.torn_tail.offset == last.offset
    assert 0 < report.torn_tail.bytes <= 60
    assert report.records == len(builder.records) - 1
    assert report.last_valid_offset == last.offset


def test_garbage_after_the_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    end = builder.records[-1].end
    builder.write()
    builder.damage(end + 100, b"\xff" * 10)  # zeros, then a few bytes
    report = verify(builder.commitlog)
    assert report.valid
    assert report.torn_tail is not None
    assert (report.torn_tail.offset, report.torn_tail.bytes) == (end, 110)


def test_crc_mismatch_in_the_middle(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    bad = builder.records[7]
    builder.write()
    _break_crc(builder, bad)
    report = verify(builder.commitlog)
    assert not report.valid
    assert [f.offset for f in report.corruption] == [bad.offset]
    assert "CRC" in report.corruption[0].reason
    assert report.last_valid_offset == bad.offset
    assert report.records == len(builder.records) - 1  # the rest is still checked
    assert report.last_offset == builder.records[-1].offset
    assert report.torn_tail is None


def test_physical_offset_field_must_match_the_position(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    bad = builder.records[3]
    builder.write()
    builder.damage(bad.offset + 28, struct.pack(">q", 12345))
    report = verify(builder.commitlog)
    assert [f.offset for f in report.corruption] == [bad.offset]
    assert "physical_offset" in report.corruption[0].reason


def test_blank_marker_of_the_wrong_size(tmp_path: Path) -> None:
    builder = _multi_segment(tmp_path)
    builder.write()
    blank = builder.blanks[0]
    builder.damage(blank, struct.pack(">i", 16))
    report = verify(builder.commitlog)
    assert [f.offset for f in report.corruption] == [blank]
    assert "blank marker" in report.corruption[0].reason
    assert report.records == len(builder.records)


def test_lost_blank_marker_with_data_in_the_next_segment(tmp_path: Path) -> None:
    builder = _multi_segment(tmp_path)
    builder.write()
    blank = builder.blanks[0]
    builder.damage(blank, bytes(8))  # zeros where the marker was
    report = verify(builder.commitlog)
    assert [f.offset for f in report.corruption] == [blank]
    assert "later segment" in report.corruption[0].reason
    assert report.records == len(builder.records)
    assert report.last_valid_offset == blank


def test_torn_tail_after_corruption(tmp_path: Path) -> None:
    builder = _multi_segment(tmp_path)
    bad, last = builder.records[1], builder.records[-1]
    builder.write()
    _break_crc(builder, bad)
    builder.damage(last.offset + 50, bytes(last.size - 50))
    report = verify(builder.commitlog)
    assert [f.offset for f in report.corruption] == [bad.offset]
    assert report.torn_tail is not None and report.torn_tail.offset == last.offset
    assert report.last_valid_offset == bad.offset


def test_findings_are_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_module, "MAX_FINDINGS", 2)
    builder = _store(tmp_path)
    builder.write()
    for record in builder.records[2:9:3]:  # not adjacent: three findings
        _break_crc(builder, record)
    report = verify(builder.commitlog)
    assert report.corruption_count == 3 and len(report.corruption) == 2
    assert report.to_json()["corruption_truncated"] is True


def test_gap_in_the_segment_chain(tmp_path: Path) -> None:
    builder = _multi_segment(tmp_path)
    builder.write()
    builder.segment_path(SEGMENT_SIZE).unlink()
    with pytest.raises(CommitlogLayoutError, match="gap"):
        verify(builder.commitlog)


def test_ipv6_and_v2_topic(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    v6 = HostAddress("2001:db8::7", 10911)
    builder.append("t" * 200, b"v2", born_host=v6, store_host=v6)
    builder.append("x" * 127, b"v1 at the limit", store_host=v6)
    builder.append_many(3)
    builder.write()
    report = verify(builder.commitlog)
    assert report.valid and report.records == 5


def test_progress_and_json(tmp_path: Path) -> None:
    builder = _multi_segment(tmp_path)
    builder.write()
    calls: list[tuple[int, int]] = []
    report = verify(builder.commitlog, lambda done, total: calls.append((done, total)))
    assert calls[-1] == (4 * SEGMENT_SIZE, 4 * SEGMENT_SIZE)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["valid"] is True and doc["records"] == len(builder.records)
    assert doc["torn_tail"] is None and doc["corruption"] == []


def test_stray_file_is_a_warning(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    (builder.commitlog / "notes.txt").write_text("hi")
    report = verify(builder.commitlog)
    assert report.valid
    assert any("notes.txt" in w for w in report.warnings)


def test_blank_marker_ends_the_data(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.roll()  # crashed after the marker, before the next record
    builder.write()
    report = verify(builder.commitlog)
    assert report.valid and report.torn_tail is None and report.blank_markers == 1


def test_damage_before_a_blank_marker_is_corruption(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.roll()
    builder.write()
    last = builder.records[-1]
    _break_crc(builder, last)
    report = verify(builder.commitlog)
    assert [f.offset for f in report.corruption] == [last.offset]
    assert "blank marker follows" in report.corruption[0].reason
    assert report.blank_markers == 1 and report.torn_tail is None


# ---- after a crash: the store root's marks (tide.format.TailMarks)


def _interrupted(builder: StoreBuilder, record: Written) -> None:
    """What glibc's memcpy leaves when killed mid-copy: the first 32 bytes, stored last,
    are still zeros; the rest of the batch is there."""
    builder.damage(record.offset, bytes(32))


def _data_end(builder: StoreBuilder) -> int:
    """Past the last non-zero byte (a record without properties ends with zeros)."""
    last = builder.records[-1]
    return last.offset + len(builder.read(last.offset, last.size).rstrip(b"\0"))


def test_interrupted_write_past_the_durable_offset_is_a_torn_tail(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    first_of_batch = builder.records[15]
    _interrupted(builder, first_of_batch)
    marks = TailMarks(durable_offset=first_of_batch.offset, crashed=True)
    report = verify(builder.commitlog, marks=marks)
    assert report.valid, report.corruption
    assert report.tail_marks == marks
    assert report.torn_tail is not None
    assert report.torn_tail.offset == first_of_batch.offset
    assert report.torn_tail.bytes == _data_end(builder) - first_of_batch.offset
    assert "a valid record follows at" in report.torn_tail.reason
    assert "the write the crash interrupted" in report.torn_tail.reason
    assert report.last_valid_offset == first_of_batch.offset
    assert report.records == 15  # those after the hole belong to the tail


def test_interrupted_write_without_a_crash_or_below_the_durable_offset_is_corruption(
    tmp_path: Path,
) -> None:
    builder = _store(tmp_path)
    builder.write()
    victim = builder.records[15]
    _interrupted(builder, victim)
    for marks in (
        None,  # no store root: nothing says a write was in flight
        TailMarks(durable_offset=victim.offset, crashed=False),
        TailMarks(durable_offset=victim.offset + 1, crashed=True),
    ):
        report = verify(builder.commitlog, marks=marks)
        assert [f.offset for f in report.corruption] == [victim.offset], marks
        assert report.torn_tail is None


def test_torn_tail_spanning_segments_counts_to_the_last_data(tmp_path: Path) -> None:
    """A power loss can keep a later segment's pages and lose an earlier one's: the torn
    tail runs to the last non-zero byte of the log."""
    builder = _multi_segment(tmp_path)
    builder.write()
    last_of_0 = max((r for r in builder.records if r.end <= SEGMENT_SIZE), key=lambda r: r.offset)
    _interrupted(builder, last_of_0)
    marks = TailMarks(durable_offset=last_of_0.offset, crashed=True)
    report = verify(builder.commitlog, marks=marks)
    assert report.valid, report.corruption
    assert report.torn_tail is not None and report.torn_tail.offset == last_of_0.offset
    assert report.torn_tail.bytes == _data_end(builder) - last_of_0.offset


def test_zeros_below_the_durable_offset_are_corruption(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    lost = builder.records[-3]
    builder.damage(lost.offset, bytes(builder.records[-1].end - lost.offset))
    report = verify(builder.commitlog, marks=TailMarks(builder.records[-1].end, crashed=True))
    assert [f.offset for f in report.corruption] == [lost.offset]
    assert "below the durable offset" in report.corruption[0].reason
    assert verify(builder.commitlog).valid  # without the marks: the zero-filled end

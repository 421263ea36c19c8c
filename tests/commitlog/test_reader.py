"""The offline commitlog reader: segment chain checks and record iteration."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from tests.commitlog._builder import (
    BORN_HOST,
    SEGMENT_SIZE,
    STORE_HOST,
    StoreBuilder,
)
from tide.commitlog import (
    CommitlogCorruptionError,
    CommitlogLayoutError,
    NotAStoreError,
    TornTail,
    find_commitlog_dir,
    iter_records,
    open_segments,
    scan_layout,
    tail_marks_for,
    verify,
)
from tide.format import (
    ABORT_FILE,
    BLANK_MAGIC,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    HostAddress,
    Snapshot,
    TailMarks,
    encode_record,
    pack_host,
    patch_record,
    record_size,
    segment_name,
    write_snapshot,
)


def _offsets(commitlog: Path, start: int | None = None) -> list[int]:
    return [at.offset for at in iter_records(commitlog, start)]


def _three_segments(tmp_path: Path) -> StoreBuilder:
    builder = StoreBuilder(tmp_path)
    while builder.pos < 2 * SEGMENT_SIZE + 1000:
        builder.append_many(50)
    builder.write()
    return builder


# ---- layout


def test_open_segments_lists_the_chain(tmp_path: Path) -> None:
    builder = _three_segments(tmp_path)
    segments = open_segments(builder.commitlog)
    # three written segments plus the zero-filled preallocated next one
    assert [s.start_offset for s in segments] == [i * SEGMENT_SIZE for i in range(4)]
    assert {s.size for s in segments} == {SEGMENT_SIZE}
    assert segments[1].end_offset == 2 * SEGMENT_SIZE
    assert segments[2].path == builder.commitlog / segment_name(2 * SEGMENT_SIZE)


def test_stray_files_are_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    builder = StoreBuilder(tmp_path)
    builder.append()
    builder.write()
    (builder.commitlog / f"{segment_name(SEGMENT_SIZE)}.tmp").write_bytes(b"x")
    with caplog.at_level(logging.WARNING):
        segments = open_segments(builder.commitlog)
    assert len(segments) == 2
    assert ".tmp" in caplog.text
    assert any(".tmp" in w for w in scan_layout(builder.commitlog).warnings)


def test_gap_in_the_segment_chain(tmp_path: Path) -> None:
    builder = _three_segments(tmp_path)
    builder.segment_path(SEGMENT_SIZE).unlink()
    with pytest.raises(CommitlogLayoutError, match="gap in the segment chain"):
        open_segments(builder.commitlog)
    with pytest.raises(CommitlogLayoutError, match="gap"):
        list(iter_records(builder.commitlog))


def test_segment_of_another_size(tmp_path: Path) -> None:
    builder = _three_segments(tmp_path)
    with builder.segment_path(2 * SEGMENT_SIZE).open("r+b") as f:
        f.truncate(SEGMENT_SIZE // 2)
    with pytest.raises(CommitlogLayoutError, match="same size"):
        open_segments(builder.commitlog)


def test_directory_named_like_a_segment(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    builder.write(preallocate_next=False)
    (builder.commitlog / segment_name(SEGMENT_SIZE)).mkdir()
    with pytest.raises(CommitlogLayoutError, match="not a regular file"):
        open_segments(builder.commitlog)


def test_empty_segment_file(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    builder.write(preallocate_next=False)
    (builder.commitlog / segment_name(SEGMENT_SIZE)).write_bytes(b"")
    with pytest.raises(CommitlogLayoutError, match="empty"):
        open_segments(builder.commitlog)


def test_unaligned_first_segment(tmp_path: Path) -> None:
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    (commitlog / segment_name(100)).write_bytes(bytes(SEGMENT_SIZE))
    with pytest.raises(CommitlogLayoutError, match="multiple of the segment size"):
        open_segments(commitlog)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(CommitlogLayoutError, match="not a directory"):
        open_segments(tmp_path / "nope")


def test_find_commitlog_dir(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    assert find_commitlog_dir(tmp_path) == tmp_path / "commitlog"  # a store root
    assert find_commitlog_dir(tmp_path / "commitlog") == tmp_path / "commitlog"  # empty log
    copy = tmp_path / "archive"
    copy.mkdir()
    (copy / segment_name(0)).write_bytes(bytes(SEGMENT_SIZE))
    assert find_commitlog_dir(copy) == copy  # a commitlog copied under another name


def test_find_commitlog_dir_refuses_a_directory_that_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(NotAStoreError, match="is not a Tide/RocketMQ store: no commitlog/"):
        find_commitlog_dir(tmp_path)  # empty
    (tmp_path / "passwd").write_text("root:x:0:0\n")
    (tmp_path / "config").mkdir()
    with pytest.raises(NotAStoreError, match="is not a Tide/RocketMQ store: no commitlog/"):
        find_commitlog_dir(tmp_path)  # files, none of them a segment (like /etc)
    with pytest.raises(NotAStoreError, match="not a directory"):
        find_commitlog_dir(tmp_path / "passwd")
    with pytest.raises(NotAStoreError, match="not a directory"):
        find_commitlog_dir(tmp_path / "missing")


# ---- records


def test_empty_store(tmp_path: Path) -> None:
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    assert list(iter_records(commitlog)) == []
    (commitlog / segment_name(0)).write_bytes(bytes(SEGMENT_SIZE))
    assert list(iter_records(commitlog)) == []


def test_every_field_round_trips(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    builder.append("A", b"first", properties={"TAGS": "t1", "KEYS": "k1 k2"}, flag=7)
    second = builder.append("B", b"second", queue_id=3, properties={"UNIQ_KEY": "u"})
    builder.append("A", b"third")
    builder.write()
    records = list(iter_records(builder.commitlog))
    assert [at.offset for at in records] == [w.offset for w in builder.records]
    at = records[1]
    r = at.record
    assert at.end_offset == second.end
    assert (r.topic, r.body, r.queue_id, r.queue_offset) == ("B", b"second", 3, 0)
    assert r.physical_offset == second.offset
    assert r.properties == {"UNIQ_KEY": "u"}
    assert r.store_timestamp_ms == second.store_timestamp_ms
    assert (r.born_host, r.store_host) == (BORN_HOST, STORE_HOST)
    assert r.magic == MESSAGE_MAGIC_V1
    assert records[0].record.flag == 7
    assert records[2].record.queue_offset == 1


def test_blank_marker_and_roll(tmp_path: Path) -> None:
    builder = _three_segments(tmp_path)
    assert len(builder.blanks) == 2
    offsets = _offsets(builder.commitlog)
    assert offsets == [w.offset for w in builder.records]
    assert SEGMENT_SIZE in offsets and 2 * SEGMENT_SIZE in offsets
    blank = builder.blanks[0]
    total_size, magic = struct.unpack(">ii", builder.read(blank, 8))
    assert (total_size, magic) == (SEGMENT_SIZE - blank, BLANK_MAGIC)


def test_record_fills_segment_up_to_the_blank_reserve(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    builder.append()
    filler = builder.fill_to_reserve()
    assert filler.end == SEGMENT_SIZE - 8
    after = builder.append(body=b"next")
    builder.write()
    assert builder.blanks == [SEGMENT_SIZE - 8]  # an 8-byte blank marker
    assert after.offset == SEGMENT_SIZE
    assert _offsets(builder.commitlog) == [0, filler.offset, SEGMENT_SIZE]


def test_segment_filled_to_its_last_byte_is_followed(tmp_path: Path) -> None:
    # Not what the writer does (it keeps 8 bytes for the blank), but readable all the same.
    builder = StoreBuilder(tmp_path)
    body_len = SEGMENT_SIZE - record_size(0, len("TopicTest"), 0)
    encoded = encode_record(
        "TopicTest", b"TopicTest", 0, b"z" * body_len, b"", 0, 0, 1, pack_host(BORN_HOST),
        pack_host(STORE_HOST),
    )  # fmt: skip
    assert len(encoded.data) == SEGMENT_SIZE
    segment = builder.segments[0]
    segment[:] = encoded.data
    patch_record(segment, 0, encoded.store_timestamp_pos, 0, 0, 2)
    builder.pos = SEGMENT_SIZE
    builder.append(body=b"second segment")
    builder.write()
    assert _offsets(builder.commitlog) == [0, SEGMENT_SIZE]
    report = verify(builder.commitlog)
    assert report.valid and report.records == 2
    assert any("full without a blank marker" in w for w in report.warnings)


def test_zero_filled_preallocated_tail(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    builder.append_many(10)
    builder.write(preallocate_next=True)
    assert len(open_segments(builder.commitlog)) == 2
    assert _offsets(builder.commitlog) == [w.offset for w in builder.records]


def test_start_offset(tmp_path: Path) -> None:
    builder = _three_segments(tmp_path)
    offsets = [w.offset for w in builder.records]
    commitlog = builder.commitlog
    assert _offsets(commitlog, offsets[5]) == offsets[5:]
    assert _offsets(commitlog, offsets[5] + 1) == offsets[6:]  # inside a record
    assert _offsets(commitlog, SEGMENT_SIZE) == [o for o in offsets if o >= SEGMENT_SIZE]
    assert _offsets(commitlog, builder.blanks[0] + 3) == [o for o in offsets if o >= SEGMENT_SIZE]
    assert _offsets(commitlog, 0) == offsets
    assert _offsets(commitlog, 100 * SEGMENT_SIZE) == []


def test_start_offset_below_the_oldest_segment(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path, first_offset=4 * SEGMENT_SIZE)
    builder.append_many(3)
    builder.write()
    assert _offsets(builder.commitlog, 0) == [w.offset for w in builder.records]
    assert builder.records[0].offset == 4 * SEGMENT_SIZE


def test_ipv6_hosts(tmp_path: Path) -> None:
    born = HostAddress("2001:db8::1", 40000)
    store = HostAddress("fe80::abcd", 10911)
    builder = StoreBuilder(tmp_path)
    builder.append(body=b"v4")
    builder.append(body=b"v6", born_host=born, store_host=store)
    builder.append(body=b"mixed", store_host=store)
    builder.write()
    records = [at.record for at in iter_records(builder.commitlog)]
    assert [r.body for r in records] == [b"v4", b"v6", b"mixed"]
    assert (records[1].born_host, records[1].store_host) == (born, store)
    assert (records[2].born_host, records[2].store_host) == (BORN_HOST, store)


def test_v2_magic_with_a_200_byte_topic(tmp_path: Path) -> None:
    topic = "t" * 200
    builder = StoreBuilder(tmp_path)
    builder.append(topic, b"long topic")
    builder.append("short", b"short topic")
    builder.write()
    records = [at.record for at in iter_records(builder.commitlog)]
    assert [(r.topic, r.magic) for r in records] == [
        (topic, MESSAGE_MAGIC_V2),
        ("short", MESSAGE_MAGIC_V1),
    ]


def test_torn_tail_ends_the_iteration(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    builder.append_many(5)
    last = builder.records[-1]
    builder.write()
    builder.damage(last.offset + 40, bytes(last.size - 40))  # only the first 40 bytes made it
    torn: list[TornTail] = []
    offsets = [at.offset for at in iter_records(builder.commitlog, on_torn_tail=torn.append)]
    assert offsets == [w.offset for w in builder.records[:-1]]
    assert len(torn) == 1
    assert torn[0].offset == last.offset
    assert 0 < torn[0].bytes <= 40


def test_corruption_in_the_middle_raises(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    builder.append_many(5)
    bad = builder.records[2]
    builder.write()
    body_pos = bad.size - len(bad.body) - len("TopicTest") - 1 - 2
    builder.damage(bad.offset + body_pos, b"X")
    seen: list[int] = []
    with pytest.raises(CommitlogCorruptionError, match="CRC") as info:
        seen.extend(at.offset for at in iter_records(builder.commitlog))
    assert info.value.offset == bad.offset
    assert seen == [w.offset for w in builder.records[:2]]
    # Without CRC checks the damaged body reads through.
    assert len(list(iter_records(builder.commitlog, check_crc=False))) == 5


def test_interrupted_write_after_a_crash_ends_the_iteration(tmp_path: Path) -> None:
    """The marks of a store root that crashed: zeros at the head of the last batch, valid
    records after them, is the write the crash interrupted (verify and recovery agree)."""
    builder = StoreBuilder(tmp_path)
    builder.append_many(8)
    first_of_batch = builder.records[5]
    builder.write()
    builder.damage(first_of_batch.offset, bytes(32))
    with pytest.raises(CommitlogCorruptionError, match="a valid record follows"):
        list(iter_records(builder.commitlog))
    marks = TailMarks(durable_offset=first_of_batch.offset, crashed=True)
    torn: list[TornTail] = []
    records = iter_records(builder.commitlog, on_torn_tail=torn.append, marks=marks)
    assert [at.offset for at in records] == [w.offset for w in builder.records[:5]]
    assert [t.offset for t in torn] == [first_of_batch.offset]
    assert "the write the crash interrupted" in torn[0].reason


def test_tail_marks_for_a_store_root(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    builder.append_many(3)
    builder.write()
    assert tail_marks_for(builder.commitlog) == TailMarks()
    (tmp_path / ABORT_FILE).touch()
    write_snapshot(tmp_path, Snapshot(builder.pos, builder.pos, {}))
    assert tail_marks_for(builder.commitlog) == TailMarks(builder.pos, crashed=True)
    elsewhere = tmp_path / "copy"
    builder.commitlog.rename(elsewhere)  # a commitlog directory outside a store root
    assert tail_marks_for(elsewhere) == TailMarks()


def test_stopping_early_closes_the_mappings(tmp_path: Path) -> None:
    builder = _three_segments(tmp_path)
    records = iter_records(builder.commitlog)
    first = next(records)
    assert first.offset == 0
    records.close()  # closes the segment's mmap: no buffer may still be exported


def test_lost_blank_marker_raises(tmp_path: Path) -> None:
    builder = _three_segments(tmp_path)
    builder.damage(builder.blanks[0], bytes(8))
    with pytest.raises(CommitlogCorruptionError, match="later segment") as info:
        list(iter_records(builder.commitlog))
    assert info.value.offset == builder.blanks[0]

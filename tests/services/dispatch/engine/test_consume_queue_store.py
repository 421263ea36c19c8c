"""ConsumeQueueStore: loading the consumequeue tree, table limits, store-wide operations."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from services.dispatch.engine.consume_queue import ConsumeQueueCorruptError, ConsumeQueueError
from services.dispatch.engine.consume_queue_store import (
    ConsumeQueueLimitError,
    ConsumeQueueStore,
    StoreCounts,
    parse_queue_id,
)

EPS = 10
SEG = EPS * 20
RAW = struct.Struct(">qiq")


def open_store(root: Path, **kwargs: int) -> ConsumeQueueStore:
    store = ConsumeQueueStore(root, EPS, **kwargs)
    store.load()
    store.recover()
    return store


def write_segment(root: Path, topic: str, queue_dir: str, entries: list[tuple[int, int]]) -> None:
    """A segment 0 holding entries (commitlog offset, size)."""
    directory = root / "consumequeue" / topic / queue_dir
    directory.mkdir(parents=True, exist_ok=True)
    data = b"".join(RAW.pack(offset, size, 0) for offset, size in entries)
    (directory / f"{0:020d}").write_bytes(data + bytes(SEG - len(data)))


def test_load_finds_queues_and_skips_junk(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_segment(tmp_path, "TopicA", "0", [(0, 100), (100, 50)])
    write_segment(tmp_path, "TopicA", "3", [(150, 10)])
    write_segment(tmp_path, "TopicB", "1", [])
    write_segment(tmp_path, "bad topic", "0", [(0, 1)])  # invalid topic name
    write_segment(tmp_path, "TopicA", "007", [(0, 1)])  # not a canonical queue id
    write_segment(tmp_path, "TopicA", "x", [(0, 1)])
    (tmp_path / "consumequeue" / "stray-file").write_text("junk")
    (tmp_path / "consumequeue" / "TopicB" / "5").write_text("a file, not a queue")
    with caplog.at_level(logging.WARNING):
        store = ConsumeQueueStore(tmp_path, EPS)
        store.load()
    assert store.topics() == {"TopicA": [0, 3], "TopicB": [1]}
    assert store.recover() == 160
    assert store.counts() == StoreCounts(queues=3, segments=3)
    ignored = " ".join(r.getMessage() for r in caplog.records)
    for junk in ("bad topic", "007", "/x", "stray-file", "TopicB/5"):
        assert junk in ignored
    queue = store.find("TopicA", 0)
    assert queue is not None
    assert (queue.min_offset, queue.max_offset) == (0, 2)
    store.close()


def test_load_of_a_broken_queue_raises_and_unmaps_the_others(tmp_path: Path) -> None:
    write_segment(tmp_path, "TopicA", "0", [(0, 100)])
    write_segment(tmp_path, "TopicB", "0", [(0, 100)])
    (tmp_path / "consumequeue" / "TopicB" / "0" / f"{0:020d}").write_bytes(bytes(SEG + 1))
    store = ConsumeQueueStore(tmp_path, EPS)
    with pytest.raises(ConsumeQueueCorruptError, match=r"TopicB/0.*201 bytes"):
        store.load()
    queue = store.find("TopicA", 0)
    assert queue is not None
    assert queue.segment_count == 0  # closed
    with pytest.raises(ConsumeQueueError, match="closed"):
        store.get_or_create("TopicC", 0)


def test_empty_store(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    assert store.topics() == {}
    assert store.max_commitlog_end() == 0
    assert store.counts() == StoreCounts(0, 0)
    assert store.flush(0) is False
    assert not (tmp_path / "consumequeue").exists()  # nothing created until a put
    store.close()


def test_get_or_create_and_find(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    assert store.find("TopicA", 0) is None
    queue = store.get_or_create("TopicA", 0)
    assert store.get_or_create("TopicA", 0) is queue
    assert store.find("TopicA", 0) is queue
    assert store.find("TopicA", 1) is None
    assert queue.put(0, 0, 100, 0)
    assert (tmp_path / "consumequeue" / "TopicA" / "0" / f"{0:020d}").stat().st_size == SEG
    with pytest.raises(ValueError, match="contains"):
        store.get_or_create("Topic/A", 0)
    assert store.topics() == {"TopicA": [0]}
    store.close()


def test_queue_limit(tmp_path: Path) -> None:
    store = open_store(tmp_path, max_queues=2)
    assert store.get_or_create("TopicA", 0).put(0, 0, 10, 0)
    assert store.get_or_create("TopicA", 1).put(0, 10, 10, 0)
    with pytest.raises(ConsumeQueueLimitError, match=r"holds 2 consume queues, the limit \(2\)"):
        store.get_or_create("TopicA", 2)
    assert store.topics() == {"TopicA": [0, 1]}
    store.close()
    assert not (tmp_path / "consumequeue" / "TopicA" / "2").exists()
    write_segment(tmp_path, "TopicB", "0", [])  # a third queue on disk
    store = ConsumeQueueStore(tmp_path, EPS, max_queues=2)
    with pytest.raises(ConsumeQueueLimitError):
        store.load()
    with pytest.raises(ValueError, match="max queues"):
        ConsumeQueueStore(tmp_path, EPS, max_queues=0)


def test_store_wide_truncate_delete_flush_and_max_end(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    a = store.get_or_create("TopicA", 0)
    b = store.get_or_create("TopicB", 7)
    for n in range(15):  # interleaved in one commitlog: A at n * 200, B at n * 200 + 100
        assert a.put(n, n * 200, 100, 0)
        assert b.put(n, n * 200 + 100, 100, 0)
    assert store.max_commitlog_end() == 3000
    assert store.counts() == StoreCounts(queues=2, segments=4)
    assert store.flush(2) is True  # the full segments
    assert store.truncate_past(2500) == 5  # A drops 13, 14; B drops 12, 13, 14
    assert (a.max_offset, b.max_offset) == (13, 12)
    assert store.max_commitlog_end() == 2500
    assert store.delete_below(2100) == 2
    assert (a.min_offset, b.min_offset) == (11, 10)
    assert store.counts() == StoreCounts(queues=2, segments=2)
    store.close()
    store = open_store(tmp_path)
    assert store.recover() == 2500
    assert store.topics() == {"TopicA": [0], "TopicB": [7]}
    store.close()


def test_parse_queue_id() -> None:
    assert parse_queue_id("0") == 0
    assert parse_queue_id("1023") == 1023
    assert parse_queue_id(str(2**31 - 1)) == 2**31 - 1
    for junk in ("", "-1", "+1", "01", "1.0", "²", str(2**31), "a"):
        assert parse_queue_id(junk) is None, junk

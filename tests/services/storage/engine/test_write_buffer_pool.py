"""The write buffer pool: appends land in pooled memory, the commit thread moves them
into the file; readers see committed bytes only."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from services.storage.engine.config import FlushMode
from services.storage.engine.message_store import MessageStore
from services.storage.engine.write_buffer_pool import WriteBufferPool
from tests.services.storage.engine.conftest import (
    BLANK_BYTES,
    SEGMENT_BYTES,
    TIMEOUT_S,
    StoreFactory,
    msg,
    msg_of_size,
    read_records,
    segment_path,
)
from tide.format import decode_record
from tide.mapped import MappedFile
from tide.waiting import wait_until

NEVER_MS = 3_600_000
# Never commits on its own: only close() (or a SYNC flush) moves bytes into the file.
NO_COMMIT: dict[str, Any] = {
    "write_buffer_pool_enabled": True,
    "write_buffer_pool_buffers": 2,
    "commit_interval_ms": NEVER_MS,
    "commit_thorough_interval_ms": NEVER_MS,
    "flush_interval_ms": NEVER_MS,
}
FAST_COMMIT: dict[str, Any] = {
    "write_buffer_pool_enabled": True,
    "write_buffer_pool_buffers": 2,
    "commit_interval_ms": 10,
    "commit_thorough_interval_ms": 10,
    "flush_interval_ms": 10,
    "flush_least_pages": 0,
}
# Generous against 10 ms intervals, and short enough to keep a failing run quick.
COMMIT_TIMEOUT_S = 5.0
RECORD_BYTES = 40_000
PER_SEGMENT = (SEGMENT_BYTES - BLANK_BYTES) // RECORD_BYTES


def file_slice(store_dir: Path, start: int, pos: int, size: int) -> bytes:
    with segment_path(store_dir, start).open("rb") as f:
        f.seek(pos)
        return f.read(size)


def readable(store: MessageStore, offset: int, size: int) -> bool:
    return len(store.commitlog.read_raw(offset, size)[1]) == size


def test_appends_are_invisible_until_committed(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store(**NO_COMMIT)
    assert store.pool is not None
    batch = store.put([msg(body=b"pooled"), msg(queue_id=1, body=b"too")]).batch
    offset, size, _ = batch.positions[0]
    segment = store.segments.segments[0]
    assert segment.write_buffer is not None
    appended = bytes(segment.write_buffer[: batch.end_offset])
    assert decode_record(appended, 0, size, expected_offset=0).body == b"pooled"

    assert store.commitlog.read_raw(offset, size) == (offset, b"")
    with pytest.raises(IndexError):
        store.commitlog.read_record(offset, size)
    status = store.status()
    assert (status.max_offset, status.committed_offset) == (batch.end_offset, 0)
    assert file_slice(store_dir, 0, 0, batch.end_offset) == bytes(batch.end_offset)
    assert store.pool.available == store.pool.capacity - 1

    store.close()  # commits and flushes
    assert file_slice(store_dir, 0, 0, batch.end_offset) == appended
    reopened = make_store(**NO_COMMIT)
    assert [(r.body, r.queue_id) for r in read_records(reopened)] == [
        (b"pooled", 0),
        (b"too", 1),
    ]


def test_appends_become_readable_after_the_commit_interval(
    make_store: StoreFactory, store_dir: Path
) -> None:
    store = make_store(**{**FAST_COMMIT, "commit_thorough_interval_ms": 100})
    batch = store.put([msg(body=bytes([i]) * (100 * i), keys=[f"k{i}"]) for i in range(5)]).batch
    segment = store.segments.segments[0]
    assert segment.write_buffer is not None
    appended = bytes(segment.write_buffer[: batch.end_offset])
    wait_until(
        lambda: readable(store, 0, batch.end_offset), "the commit thread to commit the batch"
    )
    assert store.commitlog.read_raw(0, batch.end_offset) == (0, appended)
    assert file_slice(store_dir, 0, 0, batch.end_offset) == appended
    assert [r.body for r in read_records(store)] == [bytes([i]) * (100 * i) for i in range(5)]
    wait_until(
        lambda: store.segments.flushed_offset >= batch.end_offset,
        "the flush after the commit",
    )


def test_commit_waits_for_least_pages(make_store: StoreFactory) -> None:
    store = make_store(
        **{**FAST_COMMIT, "commit_least_pages": 4, "commit_thorough_interval_ms": NEVER_MS}
    )
    small = store.put([msg(body=b"s")]).batch
    # Deliberately lets time pass (~15 commit intervals) to show that one page is not
    # enough: there is no state to wait on for something that must not happen.
    time.sleep(0.15)
    assert not readable(store, 0, small.end_offset)
    big = store.put([msg(body=b"b" * 5000) for _ in range(4)]).batch  # > 4 pages
    wait_until(lambda: readable(store, 0, big.end_offset), "a commit once 4 pages are new")


def test_more_segments_than_buffers(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store(**NO_COMMIT)
    assert store.pool is not None
    count = 3 * PER_SEGMENT + 1  # four segments, two buffers
    batch = store.put([msg_of_size(RECORD_BYTES, queue_id=1) for _ in range(count)]).batch
    segments = store.segments.segments
    assert len(segments) == 4
    assert [s.write_buffer is not None for s in segments] == [True, True, False, False]
    assert store.pool.available == 0
    # Nothing in segment 0 is committed yet: the readable prefix is empty.
    assert store.status().committed_offset == 0
    assert not readable(store, 0, RECORD_BYTES)
    # The segments without a buffer are written through the mapping: in the file already.
    for segment in segments[2:]:
        first = decode_record(
            file_slice(store_dir, segment.start_offset, 0, RECORD_BYTES),
            0,
            RECORD_BYTES,
            expected_offset=segment.start_offset,
        )
        assert first.physical_offset == segment.start_offset
        assert first.queue_offset == (segment.start_offset // SEGMENT_BYTES) * PER_SEGMENT
    assert file_slice(store_dir, 0, 0, RECORD_BYTES) == bytes(RECORD_BYTES)  # buffered
    store.close()
    reopened = make_store(**NO_COMMIT)
    records = read_records(reopened)
    assert [r.physical_offset for r in records] == [p[0] for p in batch.positions]
    assert [r.queue_offset for r in records] == list(range(count))


def test_buffers_return_to_the_pool(make_store: StoreFactory) -> None:
    store = make_store(**FAST_COMMIT)
    pool = store.pool
    assert pool is not None
    count = 3 * PER_SEGMENT + 1
    batch = store.put([msg_of_size(RECORD_BYTES) for _ in range(count)]).batch
    # Segments 0 and 1 had the two buffers; once full and committed they give them back.
    wait_until(
        lambda: pool.available == pool.capacity,
        "both buffers back in the pool",
        COMMIT_TIMEOUT_S,
    )
    assert all(s.write_buffer is None for s in store.segments.segments)
    assert [r.physical_offset for r in read_records(store)] == [p[0] for p in batch.positions]
    # The next roll takes a buffer again, and gives it back when that segment is full.
    fill = [msg_of_size(RECORD_BYTES) for _ in range(2 * PER_SEGMENT)]
    more = store.put(fill).batch
    wait_until(
        lambda: readable(store, more.positions[-1][0], RECORD_BYTES),
        "the commit",
        COMMIT_TIMEOUT_S,
    )
    wait_until(
        lambda: (
            pool.available + sum(s.write_buffer is not None for s in store.segments.segments)
            == pool.capacity
            and all(s.write_buffer is None for s in store.segments.segments if s.is_full)
        ),
        "full segments to give their buffers back",
        COMMIT_TIMEOUT_S,
    )
    assert len(read_records(store)) == count + len(fill)


def test_sync_flush_commits_first(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store(**{**NO_COMMIT, "flush_mode": FlushMode.SYNC})
    result = store.put([msg(body=b"durable")])
    assert result.durable is not None
    result.durable.result(timeout=TIMEOUT_S)
    offset, size, _ = result.batch.positions[0]
    assert store.segments.flushed_offset >= result.batch.end_offset
    _, data = store.commitlog.read_raw(offset, size)
    assert decode_record(data, 0, size, expected_offset=offset).body == b"durable"
    assert file_slice(store_dir, 0, offset, size) == data


def test_sync_flush_with_more_segments_than_buffers_is_durable(
    make_store: StoreFactory, store_dir: Path
) -> None:
    """When the durable future completes, every record of the batch is in the file and
    fsynced, including those in segments that had a pooled buffer."""
    store = make_store(**{**NO_COMMIT, "flush_mode": FlushMode.SYNC})
    count = 3 * PER_SEGMENT + 1
    result = store.put([msg_of_size(RECORD_BYTES, queue_id=2) for _ in range(count)])
    assert result.durable is not None
    result.durable.result(timeout=TIMEOUT_S)
    for offset, size, queue_offset in result.batch.positions:
        start = offset - offset % SEGMENT_BYTES
        data = file_slice(store_dir, start, offset - start, size)
        record = decode_record(data, 0, size, expected_offset=offset)
        assert record.queue_offset == queue_offset
    for segment in store.segments.segments:
        assert segment.flushed == segment.committed == segment.wrote, segment


def test_close_and_reopen_with_the_pool(make_store: StoreFactory, store_dir: Path) -> None:
    bodies: list[bytes] = []
    for round_ in range(3):
        store = make_store(**FAST_COMMIT)
        for i in range(PER_SEGMENT + 2):  # every round rolls at least once
            body = bytes([round_ * 50 + i]) * (RECORD_BYTES - 200)
            bodies.append(body)
            store.put([msg(body=body, tags=f"r{round_}")])
        store.close()
        reopened = make_store(**FAST_COMMIT)
        records = read_records(reopened)
        assert [r.body for r in records] == bodies
        assert [r.queue_offset for r in records] == list(range(len(bodies)))
        reopened.close()


def test_a_buffer_given_back_is_zeroed_for_its_next_segment(tmp_path: Path) -> None:
    def segment(start: int) -> MappedFile:
        path = tmp_path / f"segment-{start}"
        path.write_bytes(bytes(SEGMENT_BYTES))
        return MappedFile(path, start, SEGMENT_BYTES)

    pool = WriteBufferPool(1, SEGMENT_BYTES)
    first, second = segment(0), segment(SEGMENT_BYTES)
    pool.attach(first)
    buf = first.write_buffer
    assert buf is not None and pool.available == 0
    buf[:] = b"\xab" * SEGMENT_BYTES
    first.write_buffer = None
    pool.give_back(buf)
    pool.attach(second)
    assert second.write_buffer is buf  # the same memory, pooled
    assert buf == bytes(SEGMENT_BYTES)
    first.close()
    second.close()

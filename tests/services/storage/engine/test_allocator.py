"""Segment allocation: the next segment is prepared ahead, leftovers are cleaned up."""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.storage.engine.message_store import MessageStore
from tests.services.storage.engine.conftest import (
    SEGMENT_BYTES,
    StoreFactory,
    fill_segment,
    msg,
    read_records,
    segment_path,
)
from tide.waiting import wait_until


def commitlog_names(store_dir: Path) -> list[str]:
    return sorted(p.name for p in (store_dir / "commitlog").iterdir())


def names(*starts: int) -> list[str]:
    return [segment_path(Path(), s).name for s in starts]


def assert_preallocated(path: Path) -> None:
    st = os.stat(path)
    assert st.st_size == SEGMENT_BYTES
    assert st.st_blocks * 512 >= SEGMENT_BYTES, f"{path.name}: blocks not reserved"


def roll(store: MessageStore) -> None:
    """Write until the next append goes to a new segment, then append there."""
    if store.status().segment_count == 0:
        store.put([msg(body=b"first")])
    before = store.status().segment_count
    fill_segment(store, leave_bytes=100)
    store.put([msg(body=b"rolled")])
    assert store.status().segment_count == before + 1


def test_next_segment_is_ready_before_the_roll(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store()
    store.put([msg()])
    assert_preallocated(segment_path(store_dir, 0))
    ahead = segment_path(store_dir, SEGMENT_BYTES)
    wait_until(ahead.exists, "segment 1 to be created ahead of the roll")
    assert_preallocated(ahead)
    inode = ahead.stat().st_ino
    roll(store)
    # The roll used the prepared file (same inode), and asked for the one after it.
    assert store.segments.segments[1].path == ahead
    assert ahead.stat().st_ino == inode
    after = segment_path(store_dir, 2 * SEGMENT_BYTES)
    wait_until(after.exists, "segment 2 to be created ahead of the next roll")
    assert_preallocated(after)
    assert store.status().segment_count == 2  # created ahead, not part of the log yet
    assert not any(name.endswith(".alloc") for name in commitlog_names(store_dir))


def test_unused_segments_are_deleted_on_close(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store()
    roll(store)
    ahead = segment_path(store_dir, 2 * SEGMENT_BYTES)
    wait_until(ahead.exists, "segment 2 to be created ahead")
    end = store.status().max_offset
    store.close()
    assert commitlog_names(store_dir) == names(0, SEGMENT_BYTES)
    reopened = make_store()
    assert reopened.status().max_offset == end
    assert reopened.status().segment_count == 2
    assert read_records(reopened)[-1].body == b"rolled"


def test_close_right_after_the_first_append(make_store: StoreFactory, store_dir: Path) -> None:
    """Closing while the next segment is being created leaves no trace of it."""
    for round_ in range(5):
        store = make_store()
        store.put([msg(body=b"%d" % round_)])
        store.close()
        assert commitlog_names(store_dir) == names(0)
    store = make_store()
    assert [r.body for r in read_records(store)] == [b"%d" % i for i in range(5)]


def test_leftover_alloc_files_are_removed_at_open(
    make_store: StoreFactory, store_dir: Path
) -> None:
    commitlog = store_dir / "commitlog"
    commitlog.mkdir(parents=True)
    for name in ("00000000000000000000.alloc", "00000000000000131072.alloc"):
        (commitlog / name).write_bytes(b"half-created segment")
    store = make_store()
    # The leftovers are removed at open; the allocator then prepares segment 1 in the
    # background under a fresh .alloc name until it is renamed into place. (Not "no
    # .alloc left": that also holds before the background thread has begun.)
    wait_until(
        lambda: commitlog_names(store_dir) == names(0, SEGMENT_BYTES),
        "segment 1 prepared at open, and no .alloc left",
        state=lambda: commitlog_names(store_dir),
    )
    store.put([msg()])
    roll(store)
    store.close()
    assert commitlog_names(store_dir) == names(0, SEGMENT_BYTES)


def test_leftover_alloc_next_to_segments(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store()
    store.put([msg(body=b"kept")])
    store.close()
    leftover = store_dir / "commitlog" / (names(SEGMENT_BYTES)[0] + ".alloc")
    leftover.write_bytes(b"\xff" * 100)
    store = make_store()
    # Removed at open; the allocator then prepares segment 1 under that same name. (Not
    # just "the leftover is gone": that also holds before the background thread began.)
    segment_1 = store_dir / "commitlog" / names(SEGMENT_BYTES)[0]
    wait_until(
        lambda: segment_1.exists() and not leftover.exists(),
        "segment 1's allocation to finish",
    )
    assert segment_1.stat().st_size == SEGMENT_BYTES
    roll(store)  # creating segment 1 is not disturbed by the leftover
    assert read_records(store)[0].body == b"kept"
    assert read_records(store)[-1].body == b"rolled"


def test_without_preallocation(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store(preallocate_enabled=False)
    roll(store)
    for start in (0, SEGMENT_BYTES):
        assert segment_path(store_dir, start).stat().st_size == SEGMENT_BYTES
    assert read_records(store)[-1].body == b"rolled"


@pytest.fixture
def no_mlock() -> Iterator[None]:
    """RLIMIT_MEMLOCK of 0: mlock is refused (unless the process may lock anyway)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, hard))


@pytest.mark.usefixtures("no_mlock")
def test_warm_segments(
    make_store: StoreFactory, store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tide.storage")
    store = make_store(warm_segments_enabled=True, preallocate_enabled=False)
    store.put([msg(body=b"warm")])
    roll(store)
    roll(store)
    wait_until(segment_path(store_dir, 3 * SEGMENT_BYTES).exists, "segment 3 created ahead")
    for start in (0, SEGMENT_BYTES, 2 * SEGMENT_BYTES, 3 * SEGMENT_BYTES):
        assert_preallocated(segment_path(store_dir, start))  # warm implies allocated
    assert segment_path(store_dir, 3 * SEGMENT_BYTES).read_bytes() == bytes(SEGMENT_BYTES)
    records = read_records(store)
    assert records[0].body == b"warm"
    assert [r.queue_offset for r in records] == list(range(len(records)))
    store.close()
    assert commitlog_names(store_dir) == names(0, SEGMENT_BYTES, 2 * SEGMENT_BYTES)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    refused = [r for r in caplog.records if "mlock" in r.getMessage()]
    if os.geteuid() != 0:  # root may lock memory whatever the limit
        assert refused, "mlock refusal was not logged"
    assert all(r.levelno == logging.WARNING for r in refused)

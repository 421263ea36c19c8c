"""A full disk on each path of the engine that writes, with ENOSPC injected where a real
tmpfs cannot easily hit that path (tests/services/storage/test_disk_full.py fills a real
one): the store's disk-full error naming the store and its free space, appends refused
(``writable`` false) and resumed by themselves, nothing partial left on disk. Also the
projected usage of the disk thresholds and the forced-retention warning."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.storage.engine.disk_guard import RECHECK_MS, DiskGuard
from services.storage.engine.errors import DiskFullError
from services.storage.engine.message_store import MessageStore
from services.storage.engine.segment_files import SegmentSpaceError, create_segment
from tests.services.storage.engine._recovery_helpers import (
    SEGMENT_BYTES,
    Harness,
    crash,
    fill_segments,
    make_config,
    message,
    put,
    read_all,
)
from tide.files import DiskSpace, write_json_atomically
from tide.format import SNAPSHOT_FILE
from tide.waiting import wait_until


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "store")
    yield h
    h.close_all()


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def space(used_segments: float, total_segments: float) -> DiskSpace:
    total = int(total_segments * SEGMENT_BYTES)
    used = int(used_segments * SEGMENT_BYTES)
    return DiskSpace(total_bytes=total, free_bytes=total - used, used_bytes=used)


def wait_writable(store: MessageStore, timeout_s: float = 10.0) -> None:
    wait_until(
        lambda: store.status().writable,
        "the store to be writable again",
        timeout_s,
        interval_s=RECHECK_MS / 1000 / 4,
    )


# -- the projected usage -----------------------------------------------------------------


def test_guard_counts_the_next_segment_until_it_exists(tmp_path: Path) -> None:
    next_bytes = [SEGMENT_BYTES]
    disk = [space(8.5, 10)]  # 85 % used, 95 % with the next segment
    guard = DiskGuard(tmp_path, tmp_path, 0.90, lambda: next_bytes[0], space=lambda: disk[0])
    assert guard.update() == pytest.approx(0.95)
    assert guard.full and guard.used_ratio == pytest.approx(0.85)
    with pytest.raises(DiskFullError, match=str(tmp_path)):
        guard.check()
    next_bytes[0] = 0  # the next segment was created: it is in the usage now
    assert guard.update() == pytest.approx(0.85)
    assert not guard.full
    guard.check()


def test_the_next_segment_counts_until_it_is_created_ahead_of_need(harness: Harness) -> None:
    store = harness.open()
    next_start = store.segments.segments[-1].end_offset
    wait_until(  # scheduled at open
        lambda: store.allocator.is_prepared(next_start), "the next segment ahead of need", 10
    )
    assert store._next_segment_bytes() == 0
    store.allocator.stop()  # forgets (and deletes) what it created ahead
    assert store._next_segment_bytes() == SEGMENT_BYTES


def test_retention_thresholds_use_the_projected_usage(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    now_s = time.time() + 1000 * 3600.0  # every segment is long expired
    off_hour = (time.localtime(now_s).tm_hour + 12) % 24
    config = make_config(harness.store_dir, retention_hours=1.0, cleanup_hour=off_hour)
    # 70 %: below the clean ratio (75 %) on its own, 80 % with the next segment
    store = MessageStore(config, clock_s=lambda: now_s, disk_space=lambda: space(7, 10))
    store.open()
    harness.opened.append(store)
    fill_segments(store, 3)
    segments = len(store.segments.segments)
    monkeypatch.setattr(store.allocator, "is_prepared", lambda _start: True)
    store.retention.run_once()  # the next segment exists: 70 %
    assert len(store.segments.segments) == segments
    monkeypatch.setattr(store.allocator, "is_prepared", lambda _start: False)
    store.retention.run_once()  # it does not: 80 % with it
    assert len(store.segments.segments) == 1  # every expired one but the one written
    assert store.status().disk_usage_ratio == pytest.approx(0.70)  # as df says


# -- ENOSPC, path by path -----------------------------------------------------------------


def test_segment_creation_enospc_removes_the_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fallocate_then_fail(fd: int, offset: int, length: int) -> None:
        os.pwrite(fd, b"x" * 4096, 0)  # some blocks were allocated before it failed
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", fallocate_then_fail)
    with pytest.raises(SegmentSpaceError) as info:
        create_segment(tmp_path, 0, SEGMENT_BYTES, preallocate=True, warm=False)
    assert info.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


def test_segment_creation_refuses_at_once_when_the_segment_cannot_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tide.files._space.disk_space", lambda _path: space(9.5, 10))
    with pytest.raises(SegmentSpaceError, match="bytes needed"):
        create_segment(tmp_path, 0, SEGMENT_BYTES, preallocate=True, warm=True)
    assert list(tmp_path.iterdir()) == []  # not even tried


def test_roll_enospc_refuses_appends_writes_nothing_and_resumes(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = harness.open()
    written = fill_segments(store, 1)
    store.allocator.stop()  # no segment created ahead: the roll creates it
    real_fallocate = os.posix_fallocate

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    max_before = store.segments.max_offset
    segments_before = sorted(harness.commitlog_dir.iterdir())
    big = message("Full", 0, b"y" * 8000)
    for _ in range(2):  # the next one is refused at the guard (re-measured at most 10/s)
        with pytest.raises(DiskFullError) as info:
            for _ in range(SEGMENT_BYTES // 8000 + 1):
                put(store, [big])
        assert str(harness.store_dir) in str(info.value) and "free" in str(info.value)
    assert not store.status().writable
    assert sorted(harness.commitlog_dir.iterdir()) == segments_before  # no partial segment
    assert store.segments.max_offset >= max_before
    acked = store.segments.max_offset

    monkeypatch.setattr(os, "posix_fallocate", real_fallocate)
    wait_writable(store)
    (after,) = put(store, [big])
    assert after.offset >= acked
    bodies = [record.body for record in read_all(store)]
    assert bodies[: len(written)] == [w.body for w in written]


def test_checkpoint_enospc_marks_the_store_full_until_space_returns(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = harness.open()
    put(store, [message("Cp", 0, b"before")])

    def no_space() -> bool:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(store.checkpoint.path))

    monkeypatch.setattr(store.checkpoint, "flush", no_space)
    store.checkpoint_service.run_once()  # no exception out of the thread's round
    assert not store.status().writable
    with pytest.raises(DiskFullError, match="checkpoint"):
        put(store, [message("Cp", 0, b"refused")])
    monkeypatch.undo()
    wait_writable(store)  # the disk itself has room: the guard's next measure says so
    (after,) = put(store, [message("Cp", 0, b"after")])
    assert after.queue_offset == 1
    store.checkpoint_service.run_once()


def test_config_json_enospc_leaves_the_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "topics.json"
    write_json_atomically(path, {"version": 1})

    def short_write(target: Path, data: bytes) -> None:
        target.write_bytes(data[:3])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))

    monkeypatch.setattr("tide.files._json._write_synced", short_write)
    with pytest.raises(OSError) as info:
        write_json_atomically(path, {"version": 2})
    assert info.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topics.json"]
    assert path.read_text() == '{\n  "version": 1\n}'


def test_consumer_offsets_enospc_keeps_the_commits_for_the_next_round(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = harness.open(consumer_offsets_persist_interval_ms=1)
    store.consumer_offsets.commit("g", "T", 0, 5)

    def no_space(_path: Path, _obj: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "consumerOffset.json")

    monkeypatch.setattr("services.storage.engine.consumer_offsets.write_json_atomically", no_space)
    store.checkpoint_service.run_once()
    assert not store.status().writable
    monkeypatch.undo()
    wait_writable(store)
    store.checkpoint_service.run_once()
    assert '"T@g"' in store.consumer_offsets.path.read_text()


# -- forced retention ---------------------------------------------------------------------


@pytest.mark.parametrize("reopened", [False, True], ids=["written-here", "scanned"])
def test_forced_retention_warns_about_unconsumed_messages(
    harness: Harness, caplog: pytest.LogCaptureFixture, reopened: bool
) -> None:
    """The deleted queue offsets come from the commitlog's marks for segments written by
    this process, from a scan of the deleted segments for those written before."""
    store = harness.open(delete_segments_per_pass=1)
    written = fill_segments(store, 2)
    if reopened:
        store.close()
        store = harness.open(delete_segments_per_pass=1)
    in_first = [w for w in written if w.offset < SEGMENT_BYTES]
    topic, queue_id = in_first[0].topic, in_first[0].queue_id
    queue_in_first = [w for w in in_first if w.queue_id == queue_id]
    store.consumer_offsets.commit("slow", topic, queue_id, 1)  # consumed only the first
    store.consumer_offsets.commit("done", topic, queue_id, 10**6)  # consumed everything
    harness.ratio[0] = 0.86
    with caplog.at_level(logging.WARNING, logger="tide.storage.retention"):
        store.retention.run_once()
    assert store.segments.min_offset == SEGMENT_BYTES
    expected = len(queue_in_first) - 1
    assert store.retention.unconsumed_deleted == expected
    (warning,) = [r.getMessage() for r in caplog.records if "not yet consumed" in r.getMessage()]
    assert f"topic {topic!r} group 'slow': {expected}" in warning
    assert "'done'" not in warning


def test_close_enospc_closes_anyway_and_the_next_open_recovers(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = harness.open()
    (written,) = put(store, [message("Close", 0, b"kept")])
    store.consumer_offsets.commit("g", "Close", 0, 1)

    def no_space(_path: Path, _obj: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "consumerOffset.json")

    monkeypatch.setattr("services.storage.engine.consumer_offsets.write_json_atomically", no_space)
    store.close()  # no exception: the lock is released, the files unmapped
    assert harness.abort_path.exists()  # so the next open recovers as after a crash
    monkeypatch.undo()
    reopened = harness.open()
    assert reopened.recovery is not None and reopened.recovery.mode == "abnormal"
    (after,) = put(reopened, [message("Close", 0, b"after")])
    assert after.queue_offset == written.queue_offset + 1


def test_open_snapshot_enospc_opens_without_a_snapshot(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = harness.open()
    (before,) = put(store, [message("Open", 0, b"before")])
    store.close()
    assert (harness.store_dir / SNAPSHOT_FILE).exists()

    def no_space(_store_dir: Path, _snapshot: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), SNAPSHOT_FILE)

    monkeypatch.setattr("services.storage.engine.message_store.write_snapshot", no_space)
    store = harness.open()  # not a failure at every restart
    assert not (harness.store_dir / SNAPSHOT_FILE).exists()  # none that could be stale
    monkeypatch.undo()
    (after,) = put(store, [message("Open", 0, b"after")])
    assert after.queue_offset == before.queue_offset + 1
    crash(store)
    reopened = harness.open()  # recovers by a scan
    (again,) = put(reopened, [message("Open", 0, b"again")])
    assert again.queue_offset == after.queue_offset + 1

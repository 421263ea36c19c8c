"""A full disk (ENOSPC injected) on each path of the dispatch store that writes, where a
real tmpfs cannot easily hit that path (tests/services/dispatch/test_disk_full.py fills
a real one): nothing is written or published in part, no partly created file is left,
and applying again once there is room completes the work."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.dispatch.engine.consume_queue import ConsumeQueue
from services.dispatch.engine.dispatch_store import (
    PROGRESS_FILE,
    Arrival,
    DispatchConfig,
    DispatchDiskFullError,
    DispatchStore,
    _FlushThread,
)
from services.dispatch.engine.index_service import IndexService
from tests.services.dispatch.engine.test_dispatch_store import Log, Msg
from tide.format import IndexGeometry, index_key_hash, iter_entries
from tide.tail import RecordAt

EPS = 4  # entries per consume queue segment


def fail_nth(real: Callable[..., object], n: int) -> Callable[..., object]:
    """``real`` until its ``n``-th call, which fails with ENOSPC (and the rest work)."""
    calls = [0]

    def call(*args: object) -> object:
        calls[0] += 1
        if calls[0] == n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args)

    return call


def junk(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if ".alloc" in p.name or ".tmp" in p.name)


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[ConsumeQueue]:
    cq = ConsumeQueue(tmp_path, "T", 0, EPS)
    cq.load()
    cq.recover()
    yield cq
    cq.close()


def test_consume_queue_run_enospc_on_a_later_segment_writes_nothing(
    queue: ConsumeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offsets = [100 * i for i in range(10)]  # 10 entries: three segments of 4
    monkeypatch.setattr(os, "posix_fallocate", fail_nth(os.posix_fallocate, 2))
    with pytest.raises(OSError) as info:
        queue.put_run(range(10), offsets, [50] * 10, [7] * 10)
    assert info.value.errno == errno.ENOSPC
    assert queue.max_offset == 0 and queue.get_bytes(0, 10) == b""
    assert junk(tmp_path) == []
    monkeypatch.undo()
    assert queue.put_run(range(10), offsets, [50] * 10, [7] * 10) == 10  # the retry
    assert [unit[0] for unit in iter_entries(queue.get_bytes(0, 10))] == offsets


def test_index_roll_enospc_puts_no_key_of_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = IndexService(tmp_path, IndexGeometry(slot_count=4, max_entries=8))
    index.load()
    index.build_keys([10] * 5, [1000] * 5, [1, 2, 3, 4, 5])  # 5 of the first file's 7
    phys = [20, 20, 20, 30, 30]  # record 20's three keys would straddle two files
    hashes = [index_key_hash(f"T#k{i}") for i in range(5)]
    monkeypatch.setattr(os, "posix_fallocate", fail_nth(os.posix_fallocate, 1))
    with pytest.raises(OSError):
        index.build_keys(phys, [2000] * 5, hashes)
    assert index.last_indexed_offset() == 10  # nothing of the batch went in
    assert junk(tmp_path) == []
    monkeypatch.undo()
    assert index.build_keys(phys, [2000] * 5, hashes) == 5
    assert index.query("T", "k1", 4, 0, 10**13) == [20]
    index.close()


def open_store(root: Path) -> DispatchStore:
    config = DispatchConfig(
        root, entries_per_segment=EPS, index_slot_count=16, index_max_entries=64
    )
    store = DispatchStore(config)
    store.open()
    return store


def two_queues() -> list[RecordAt]:
    log = Log()
    for index in range(6):
        log.add(Msg("T", index % 2, keys=f"k{index}"))
    return log.records()


def test_apply_enospc_raises_the_disk_full_error_and_the_retry_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path)
    try:
        records = two_queues()
        # queue 0's segment is created, queue 1's is not
        monkeypatch.setattr(os, "posix_fallocate", fail_nth(os.posix_fallocate, 2))
        with pytest.raises(DispatchDiskFullError) as info:
            store.apply(records)
        assert str(tmp_path) in str(info.value) and "free" in str(info.value)
        assert info.value.arrivals == [Arrival("T", 0, 3)]  # published by the caller
        assert store.status().disk_full and store.dispatched_offset == 0
        assert junk(tmp_path) == []
        monkeypatch.undo()
        assert store.apply(records) == [Arrival("T", 1, 3)]
        assert store.status().disk_full == ""
        assert store.dispatched_offset == records[-1].offset + records[-1].size
        assert store.index.query("T", "k5", 4, 0, 10**13) == [records[-1].offset]
    finally:
        store.close()


def test_progress_file_enospc_is_the_disk_full_state_not_a_thread_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path)
    try:
        store.apply(two_queues())
        thread = _FlushThread(store, 1000)

        def no_space(path: Path, obj: object) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        monkeypatch.setattr(
            "services.dispatch.engine.dispatch_store.write_json_atomically", no_space
        )
        thread.run_once()  # no exception out of the thread's round
        assert PROGRESS_FILE in (store.disk_full or "")
        assert store.status().durable_offset == 0
        monkeypatch.undo()
        thread.run_once()
        assert store.disk_full is None
        assert store.status().durable_offset == store.dispatched_offset
    finally:
        store.close()


def test_close_enospc_on_the_progress_file_closes_anyway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path)
    records = two_queues()
    store.apply(records)

    def no_space(path: Path, obj: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr("services.dispatch.engine.dispatch_store.write_json_atomically", no_space)
    store.close()  # no exception: files unmapped, the lock released
    monkeypatch.undo()
    again = open_store(tmp_path)  # the progress is older: the records are applied again
    try:
        assert again.dispatched_offset == 0
        assert again.apply(records) == []  # every entry is there already
        assert again.dispatched_offset == records[-1].offset + records[-1].size
    finally:
        again.close()


def test_reconcile_enospc_lowering_the_progress_removes_the_progress_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path)
    records = two_queues()
    store.apply(records)
    store.flush(thorough=True)
    assert (tmp_path / PROGRESS_FILE).exists()

    def no_space(path: Path, obj: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr("services.dispatch.engine.dispatch_store.write_json_atomically", no_space)
    cut = records[3].offset  # the storage truncated its tail there
    assert store.reconcile(0, cut) <= cut  # no exception: a start does not fail on it
    assert not (tmp_path / PROGRESS_FILE).exists()
    assert not (tmp_path / (PROGRESS_FILE + ".bak")).exists()
    monkeypatch.undo()
    store.close()
    again = open_store(tmp_path)  # no progress: dispatch from the storage's min offset
    try:
        assert again.reconcile(0, cut) == 0
        assert again.apply(records[:3]) == []  # what the files hold is skipped
        assert again.dispatched_offset == cut
    finally:
        again.close()

"""A dispatch process whose store is on a real small disk (a tmpfs) that fills up: it
holds its place (no crash, no restart, no reconcile), says so (GetStatus, the disk-full
state naming the store and its free space), serves what it has, leaves no partly
created file; once space is freed it resumes by itself, and every entry and key it
then serves is right."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests._tmpfs import fill, mounted_tmpfs
from tests.services.dispatch.conftest import RPC_TIMEOUT_S, DispatchLauncher, DispatchProcess
from tests.services.storage.conftest import (
    StorageLauncher,
    StorageProcess,
    message,
)
from tide.v1 import dispatch_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

DISK_BYTES = 2 << 20
# Less than a consume queue segment (1000 entries of 20 bytes, conftest) or an index
# file, more than the progress file needs.
LEFT_FREE_BYTES = 12 << 10
QUEUES = 2


@pytest.fixture
def pair_on_small_disk(tmp_path: Path) -> Iterator[tuple[StorageProcess, DispatchProcess, Path]]:
    with mounted_tmpfs(tmp_path / "disk", DISK_BYTES) as disk:
        storages = StorageLauncher(tmp_path / "procs")
        dispatches = DispatchLauncher(tmp_path / "procs")
        try:
            storage = storages.start(tmp_path / "store")
            dispatch = dispatches.start(disk / "dispatch", storage.listen)
            yield storage, dispatch, disk
        finally:
            dispatches.close()  # before the tmpfs is unmounted
            storages.close()


def produce(
    storage: StorageProcess, topic: str, start: int, count: int
) -> list[storage_pb.AppendResult]:
    messages = [
        message(topic, index % QUEUES, f"body-{index}".encode(), keys=[f"{topic}-k{index}"])
        for index in range(start, start + count)
    ]
    return storage.append(messages)


def assert_served(
    dispatch: DispatchProcess, topic: str, acked: list[storage_pb.AppendResult]
) -> None:
    """Every acknowledged message has its entry (right record) and its key."""
    for queue_id in range(QUEUES):
        expected = [(a.queue_offset, a.physical_offset, a.size) for a in acked[queue_id::QUEUES]]
        entries = dispatch.entries(topic, queue_id).entries
        assert [(e.queue_offset, e.physical_offset, e.size) for e in entries] == expected
    for index in (0, len(acked) - 1):
        request = pb.QueryIndexRequest(topic=topic, key=f"{topic}-k{index}", max_count=4)
        hits = dispatch.stub.QueryIndex(request, timeout=RPC_TIMEOUT_S).hits
        assert acked[index].physical_offset in [hit.physical_offset for hit in hits]


def entry_count(dispatch: DispatchProcess, topic: str, queue_id: int) -> int:
    try:
        return len(dispatch.entries(topic, queue_id).entries)
    except grpc.RpcError as exc:
        assert isinstance(exc, grpc.Call) and exc.code() is grpc.StatusCode.NOT_FOUND, exc
        return 0


def leftovers(store_dir: Path) -> list[Path]:
    return [p for p in store_dir.rglob("*") if p.name.endswith(".alloc") or ".tmp" in p.name]


def wait_no_leftover(dispatch: DispatchProcess) -> None:
    """While the process runs, its progress file is rewritten now and then through a
    temporary sibling that exists for the moment of one write; a file left by a failed
    write stays, so this waits until none is there (and fails naming what stayed)."""
    wait_until(
        lambda: not leftovers(dispatch.store_dir),
        "no partly written file in the dispatch's store",
        state=lambda: leftovers(dispatch.store_dir),
    )


def test_dispatch_holds_its_place_on_a_full_disk_and_resumes_when_space_is_freed(
    pair_on_small_disk: tuple[StorageProcess, DispatchProcess, Path],
) -> None:
    storage, dispatch, disk = pair_on_small_disk
    before = produce(storage, "Before", 0, 10)
    dispatch.wait_dispatched(storage.status().max_offset)
    filler = disk / "filler"
    fill(filler, LEFT_FREE_BYTES)

    # A new topic's queues need consume queue segments that cannot be created.
    after = produce(storage, "After", 0, 20)
    storage_max = storage.status().max_offset

    def full() -> bool:
        return dispatch.status().follower_state == "disk_full"

    wait_until(full, "dispatch to report its full disk")
    status = dispatch.status()
    assert str(dispatch.store_dir) in status.last_error and "free" in status.last_error
    assert status.dispatched_offset < storage_max
    assert status.tail_restarts == 0  # held in place: no reconcile, no restart
    assert dispatch.proc.poll() is None
    wait_no_leftover(dispatch)
    assert_served(dispatch, "Before", before)  # what it has is still served
    for queue_id in range(QUEUES):  # and nothing of what it could not write
        assert entry_count(dispatch, "After", queue_id) == 0
    stuck = status.dispatched_offset

    filler.unlink()
    dispatch.wait_dispatched(storage_max)
    status = dispatch.status()
    assert status.follower_state == "connected", status
    assert status.tail_restarts == 0
    assert status.dispatched_offset > stuck
    assert_served(dispatch, "Before", before)
    assert_served(dispatch, "After", after)
    more = produce(storage, "After", 20, 6)
    dispatch.wait_dispatched(storage.status().max_offset)
    assert_served(dispatch, "After", after + more)
    wait_no_leftover(dispatch)
    dispatch.stop()  # a clean close writes its progress last: nothing may be left after it
    assert leftovers(dispatch.store_dir) == []

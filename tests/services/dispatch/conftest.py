"""Real dispatch service processes (``python -m services.dispatch``) beside real storage
processes (tests/services/storage/conftest.py), for the integration tests.

:class:`DispatchLauncher` starts them and kills whatever is still running at the end of
its test; ``shared_pair`` is one storage + one dispatch for the tests that only make
calls (each uses topics of its own).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import grpc
import pytest

from tests._service_process import (
    ServiceProcess,
    spawn,
)
from tests.services.storage.conftest import (
    StorageLauncher,
    StorageProcess,
)
from tide.v1 import dispatch_pb2 as pb
from tide.v1 import dispatch_pb2_grpc as pb_grpc
from tide.waiting import wait_until

RPC_TIMEOUT_S = 20.0
BASE_ARGS: tuple[str, ...] = (
    "--listen",
    "127.0.0.1:0",
    "--flush-interval-ms",
    "100",
    "--cleanup-interval-ms",
    "500",
    # Small files: a test store stays a few MB.
    "--cq-entries-per-segment",
    "1000",
    "--index-slot-count",
    "1000",
    "--index-max-entries",
    "4000",
)


@dataclass
class DispatchProcess(ServiceProcess[pb_grpc.DispatchStub]):
    """A running dispatch service: its process, files, and a channel + stub to it."""

    service: ClassVar[str] = "dispatch"

    def make_stub(self, channel: grpc.Channel) -> pb_grpc.DispatchStub:
        return pb_grpc.DispatchStub(channel)

    # -- RPC shortcuts --------------------------------------------------------------
    def status(self) -> pb.DispatchStatus:
        return self.stub.GetStatus(pb.GetDispatchStatusRequest(), timeout=RPC_TIMEOUT_S)

    def offsets(self, topic: str, queue_id: int = 0) -> pb.GetQueueOffsetsResponse:
        return self.stub.GetQueueOffsets(
            pb.GetQueueOffsetsRequest(topic=topic, queue_id=queue_id), timeout=RPC_TIMEOUT_S
        )

    def entries(
        self,
        topic: str,
        queue_id: int = 0,
        offset: int = 0,
        max_count: int = 1024,
        tag_codes: tuple[int, ...] = (),
    ) -> pb.GetQueueEntriesResponse:
        request = pb.GetQueueEntriesRequest(
            topic=topic,
            queue_id=queue_id,
            offset=offset,
            max_count=max_count,
            tag_codes=list(tag_codes),
        )
        return self.stub.GetQueueEntries(request, timeout=RPC_TIMEOUT_S)

    def wait_dispatched(self, offset: int, timeout_s: float = 20.0) -> pb.DispatchStatus:
        """Until the dispatched offset reaches ``offset`` (a storage max offset)."""
        wait_until(
            lambda: self.status().dispatched_offset >= offset,
            f"the dispatched offset to reach {offset}",
            timeout_s,
            state=self.status,
        )
        return self.status()


class DispatchLauncher:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[DispatchProcess] = []

    def spawn(self, store_dir: Path, storage: str, *extra: str) -> DispatchProcess:
        workdir = self.root / f"dispatch{len(self.started)}"
        workdir.mkdir(parents=True)
        args = (
            sys.executable,
            "-m",
            "services.dispatch",
            "--store-dir",
            str(store_dir),
            "--storage",
            storage,
            *BASE_ARGS,
            *extra,
        )
        proc = spawn(args, workdir)
        process = DispatchProcess(proc, store_dir, workdir, args)
        self.started.append(process)
        return process

    def start(self, store_dir: Path, storage: str, *extra: str) -> DispatchProcess:
        process = self.spawn(store_dir, storage, *extra)
        process.wait_ready()
        return process

    def close(self) -> None:
        for process in self.started:
            process.reap()


@dataclass
class Pair:
    storage: StorageProcess
    dispatch: DispatchProcess


@pytest.fixture
def launchers(tmp_path: Path) -> Iterator[tuple[StorageLauncher, DispatchLauncher]]:
    storage = StorageLauncher(tmp_path / "procs")
    dispatch = DispatchLauncher(tmp_path / "procs")
    try:
        yield storage, dispatch
    finally:
        dispatch.close()
        storage.close()


@pytest.fixture(scope="module")
def shared_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("pair")
    storages = StorageLauncher(root / "procs")
    dispatches = DispatchLauncher(root / "procs")
    try:
        storage = storages.start(root / "store")
        dispatch = dispatches.start(root / "dispatch", storage.listen)
        yield Pair(storage, dispatch)
        dispatch.stop()
        storage.stop()
    finally:
        dispatches.close()
        storages.close()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test (valid charset, at most 100 bytes)."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)
    return f"T_{name}"[:100]

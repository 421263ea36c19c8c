"""Real storage service processes for the integration tests (no mocks).

:class:`StorageProcess` is one ``python -m services.storage`` child process with a gRPC
channel to it; :class:`StorageLauncher` starts them and guarantees that none outlives its
test (every process it started is killed and reaped in ``close``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest

from tests._service_process import (
    ServiceProcess,
    child_env,
    spawn,
)
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[3]
RPC_TIMEOUT_S = 20.0
SEGMENT_BYTES = 1024 * 1024
MAX_BODY_BYTES = 65536
BASE_ARGS: tuple[str, ...] = (
    "--listen",
    "127.0.0.1:0",
    "--segment-size-bytes",
    str(SEGMENT_BYTES),
    "--max-message-body-bytes",
    str(MAX_BODY_BYTES),
)
READ_BATCH = 1000  # positions per Read call (the service allows 1024)


@dataclass
class StorageProcess(ServiceProcess[pb_grpc.StorageStub]):
    """A running storage service: its process, files, and a channel + stub to it."""

    service: ClassVar[str] = "storage"

    def make_stub(self, channel: grpc.Channel) -> pb_grpc.StorageStub:
        return pb_grpc.StorageStub(channel)

    # -- RPC shortcuts --------------------------------------------------------------
    def status(self) -> pb.StorageStatus:
        return self.stub.GetStatus(pb.GetStatusRequest(), timeout=RPC_TIMEOUT_S)

    def append(self, messages: Sequence[pb.Message]) -> list[pb.AppendResult]:
        response = self.stub.Append(
            pb.AppendRequest(messages=list(messages)), timeout=RPC_TIMEOUT_S
        )
        assert len(response.results) == len(messages), response
        return list(response.results)

    def read(self, positions: Iterable[tuple[int, int]]) -> list[pb.ReadResult]:
        """Read every (physical_offset, size), in as many calls as the limit needs."""
        wanted = [pb.ReadRequest.Position(physical_offset=o, size=s) for o, s in positions]
        results: list[pb.ReadResult] = []
        for start in range(0, len(wanted), READ_BATCH):
            part = wanted[start : start + READ_BATCH]
            response = self.stub.Read(pb.ReadRequest(positions=part), timeout=RPC_TIMEOUT_S)
            assert len(response.results) == len(part), response
            results.extend(response.results)
        return results


class StorageLauncher:
    """Starts storage processes; ``close`` kills whatever is still running."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[StorageProcess] = []

    def spawn(self, store_dir: Path, *extra: str, ready_file: bool = True) -> StorageProcess:
        """Start a process; do not wait for it."""
        workdir = self.root / f"proc{len(self.started)}"
        workdir.mkdir(parents=True)
        args = (
            sys.executable,
            "-m",
            "services.storage",
            "--store-dir",
            str(store_dir),
            *BASE_ARGS,
            *extra,
        )
        proc = spawn(args, workdir, ready_file=ready_file)
        process = StorageProcess(proc, store_dir, workdir, args)
        self.started.append(process)
        return process

    def start(self, store_dir: Path, *extra: str) -> StorageProcess:
        """Start a process and wait until it serves."""
        process = self.spawn(store_dir, *extra)
        process.wait_ready()
        return process

    def close(self) -> None:
        for process in self.started:
            process.reap()


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[StorageLauncher]:
    launcher = StorageLauncher(tmp_path / "procs")
    try:
        yield launcher
    finally:
        launcher.close()


@pytest.fixture(scope="module")
def shared_storage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageProcess]:
    """One storage process (``--max-batch-messages 10``) for the tests that only make
    calls; each test uses topics of its own."""
    root = tmp_path_factory.mktemp("shared")
    launcher = StorageLauncher(root / "procs")
    try:
        process = launcher.start(root / "store", "--max-batch-messages", "10")
        yield process
        process.stop()
    finally:
        launcher.close()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test (valid charset, at most 127 bytes)."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)
    return f"T_{name}"[:100]


# -- helpers -----------------------------------------------------------------------
def message(topic: str, queue_id: int = 0, body: bytes = b"body", **fields: Any) -> pb.Message:
    return pb.Message(topic=topic, queue_id=queue_id, body=body, **fields)


def rpc_error(run: Callable[[], object]) -> grpc.Call:
    """Run ``run``; it must raise an RPC error, which is returned."""
    with pytest.raises(grpc.RpcError) as info:
        run()
    error = info.value
    assert isinstance(error, grpc.Call), error
    return error


def expect_error(code: grpc.StatusCode, run: Callable[[], object], *fragments: str) -> str:
    """``run`` fails with ``code`` and a message containing every fragment; returns the
    message."""
    error = rpc_error(run)
    details = error.details() or ""
    assert error.code() is code, f"expected {code.name}, got {error.code().name}: {details}"
    for fragment in fragments:
        assert fragment in details, f"{fragment!r} not in the error message {details!r}"
    return details


def run_cli(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -m tide.cli ARGS`` with output captured."""
    return subprocess.run(
        [sys.executable, "-m", "tide.cli", *args],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def cancel(call: grpc.RpcContext) -> None:
    """Cancel a streaming call (grpc-stubs leaves ``cancel`` unannotated)."""
    call.cancel()  # type: ignore[no-untyped-call]


def verify_store(store_dir: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("store", "verify", str(store_dir))


def segment_files(store_dir: Path) -> list[Path]:
    return sorted((store_dir / "commitlog").iterdir())

"""Real dispatch service processes (``python -m services.dispatch``) beside real storage
processes (tests/services/storage/conftest.py), for the integration tests.

:class:`DispatchLauncher` starts them and kills whatever is still running at the end of
its test; ``shared_pair`` is one storage + one dispatch for the tests that only make
calls (each uses topics of its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.services.storage.conftest import (
    CHANNEL_OPTIONS,
    REPO,
    StorageLauncher,
    StorageProcess,
)
from tide.v1 import dispatch_pb2 as pb
from tide.v1 import dispatch_pb2_grpc as pb_grpc

READY_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 30.0
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


def child_env(ready_file: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    if ready_file is not None:
        env["TIDE_READY_FILE"] = str(ready_file)
    return env


def free_port() -> int:
    """A port nothing listens on right now (bound and released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class DispatchProcess:
    proc: subprocess.Popen[bytes]
    store_dir: Path
    workdir: Path
    args: tuple[str, ...]
    listen: str = ""
    ready: dict[str, Any] = field(default_factory=dict)
    _channel: grpc.Channel | None = None
    _stub: pb_grpc.DispatchStub | None = None

    @property
    def ready_file(self) -> Path:
        return self.workdir / "ready.json"

    def stderr(self) -> str:
        try:
            return (self.workdir / "stderr.log").read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def describe(self) -> str:
        return f"dispatch process {self.proc.pid} on {self.store_dir}; stderr:\n{self.stderr()}"

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            raise AssertionError("the process is not ready (no channel)")
        return self._channel

    @property
    def stub(self) -> pb_grpc.DispatchStub:
        if self._stub is None:
            raise AssertionError("the process is not ready (no stub)")
        return self._stub

    def is_ready(self) -> bool:
        return self.ready_file.exists()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready_file.exists():
            code = self.proc.poll()
            if code is not None:
                pytest.fail(f"dispatch exited with {code} before it was ready; {self.describe()}")
            if time.monotonic() > deadline:
                pytest.fail(f"dispatch not ready after {timeout_s}s; {self.describe()}")
            time.sleep(0.02)
        self.ready = json.loads(self.ready_file.read_text(encoding="utf-8"))
        assert self.ready["pid"] == self.proc.pid, self.ready
        self.listen = str(self.ready["listen"])
        self._channel = grpc.insecure_channel(self.listen, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.DispatchStub(self._channel)

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
            self._stub = None

    def wait_exit(self, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"dispatch did not exit within {timeout_s}s; {self.describe()}")

    def stop(self) -> None:
        """SIGTERM; the process must exit 0."""
        self.close_channel()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.wait_exit()
        assert code == 0, f"exit status {code} after SIGTERM; {self.describe()}"

    def reap(self) -> None:
        self.close_channel()
        if self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=EXIT_TIMEOUT_S)

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
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if status.dispatched_offset >= offset:
                return status
            if time.monotonic() > deadline:
                pytest.fail(f"dispatched offset {status} never reached {offset}")
            time.sleep(0.02)


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
        with (
            (workdir / "stdout.log").open("wb") as out,
            (workdir / "stderr.log").open("wb") as err,
        ):
            proc = subprocess.Popen(
                args,
                cwd=REPO,
                env=child_env(workdir / "ready.json"),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
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

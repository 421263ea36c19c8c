"""A Tide service started as a real process by a test: readiness, channel, stop, kill.

Each service's conftest subclasses :class:`ServiceProcess` with its stub and RPC
shortcuts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import grpc
import pytest

from tests import _ports
from tide.spawn import NotReadyError, wait_ready
from tide.spawn import spawn as tide_spawn
from tide.tls import TlsFiles, channel_credentials

READY_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 30.0
# Tail chunks go up to 4 MiB (plus framing): lift the client's 4 MiB receive default.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]

StubT = TypeVar("StubT")


def child_env() -> dict[str, str]:
    """The test runner's environment without TIDE_* settings that could change the service."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}


REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A port to start a service on that no other test (of either xdist worker) gets:
    tests/_ports.py. Prefer port 0 and the ready file's port where the test allows."""
    return _ports.free_port()


def spawn(
    args: tuple[str, ...], workdir: Path, *, ready_file: bool = True
) -> subprocess.Popen[bytes]:
    """Start ``args`` in the repository root with stdout/stderr in ``workdir``'s
    ``stdout.log`` / ``stderr.log`` and (``ready_file``) ``workdir / "ready.json"`` as
    its TIDE_READY_FILE."""
    with (
        (workdir / "stdout.log").open("wb") as out,
        (workdir / "stderr.log").open("wb") as err,
    ):
        return tide_spawn(
            args,
            workdir / "ready.json" if ready_file else None,
            env=child_env(),
            cwd=REPO_ROOT,
            stdout=out,
            stderr=err,
        )


@dataclass
class ServiceProcess(Generic[StubT]):
    """A running service: its process, files, and a channel + stub to it."""

    service: ClassVar[str] = "service"

    proc: subprocess.Popen[bytes]
    store_dir: Path
    workdir: Path
    args: tuple[str, ...]
    listen: str = ""
    ready: dict[str, Any] = field(default_factory=dict)
    _channel: grpc.Channel | None = None
    _stub: StubT | None = None

    def make_stub(self, channel: grpc.Channel) -> StubT:
        raise NotImplementedError

    @property
    def ready_file(self) -> Path:
        return self.workdir / "ready.json"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / "stderr.log"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def describe(self) -> str:
        return (
            f"{self.service} process {self.proc.pid} on {self.store_dir}; stderr:\n{self.stderr()}"
        )

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            raise AssertionError("the process is not ready (no channel)")
        return self._channel

    @property
    def stub(self) -> StubT:
        if self._stub is None:
            raise AssertionError("the process is not ready (no stub)")
        return self._stub

    def is_ready(self) -> bool:
        return self.ready_file.exists()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait for the ready file; fail with the stderr if the process dies first."""
        name = f"{self.service} process {self.proc.pid} on {self.store_dir}"
        try:
            self.ready = wait_ready(
                self.proc, self.ready_file, name, timeout_s, stderr_path=self.stderr_path
            )
        except NotReadyError as exc:
            pytest.fail(str(exc))
        assert self.ready["pid"] == self.proc.pid, self.ready
        self.listen = str(self.ready["listen"])
        self._channel = _with_cluster_secret(
            grpc.insecure_channel(self.listen, options=CHANNEL_OPTIONS), self.args
        )
        self._stub = self.make_stub(self._channel)

    def use_tls(self, files: TlsFiles) -> None:
        """From now on ``channel``/``stub`` speak TLS, presenting ``files`` as the client
        certificate (the services of a cluster started with TLS require one)."""
        self.close_channel()
        self._channel = _with_cluster_secret(
            grpc.secure_channel(self.listen, channel_credentials(files), options=CHANNEL_OPTIONS),
            self.args,
        )
        self._stub = self.make_stub(self._channel)

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
            self._stub = None

    def wait_exit(self, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.service} did not exit within {timeout_s}s; {self.describe()}")

    def stop(self) -> None:
        """SIGTERM; the process must exit 0 (a clean close)."""
        self.close_channel()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.wait_exit()
        assert code == 0, f"exit status {code} after SIGTERM; {self.describe()}"

    def kill(self) -> None:
        """SIGKILL: a crash (no cleanup of any kind in the process)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.wait_exit()
        self.close_channel()

    def reap(self) -> None:
        """Cleanup: kill if still running; never fails."""
        self.close_channel()
        if self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=EXIT_TIMEOUT_S)


class _Metadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    """Adds fixed metadata (the cluster secret) to the test's own calls."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: Any) -> Any:
        return details._replace(metadata=(*(details.metadata or ()), *self._metadata))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


def _with_cluster_secret(channel: grpc.Channel, args: tuple[str, ...]) -> grpc.Channel:
    """A storage, dispatch or name server started with --cluster-secret-file takes the
    test's calls with the secret only (tide.server._cluster_secret): send it."""
    if "--cluster-secret-file" not in args or "services.gateway" in args:
        return channel
    path = Path(args[args.index("--cluster-secret-file") + 1])
    secret = path.read_text().strip()
    return grpc.intercept_channel(channel, _Metadata((("x-tide-cluster-secret", secret),)))

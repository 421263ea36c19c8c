"""Start a process that says it is ready by writing a ready file, and wait for that.

The one implementation for ``tide up``, the benchmarks (``bench/``, ``tide.bench``) and
the tests. A Tide service writes the JSON ready file named by ``TIDE_READY_FILE`` once
it serves (``{"listen": ..., "pid": ..., "metrics": ...}``); the benchmarks' bare
servers take the path as an argument and write ``{"listen": ...}``. Either is written
whole and renamed into place, so a ready file that exists is complete.

A process that exits before it is ready, or is not ready in time, is a
:class:`NotReadyError` naming it, with the tail of its stderr when that goes to a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tide.waiting import WaitTimeout, wait_until

READY_FILE_ENV = "TIDE_READY_FILE"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.02
STDERR_TAIL_CHARS = 8_000

Output = int | IO[Any] | None


class NotReadyError(RuntimeError):
    """A process exited before it was ready, or was not ready in time."""


class WaitCancelled(NotReadyError):
    """The caller's ``cancelled()`` turned true while waiting (e.g. Ctrl-C)."""


def spawn(
    command: Sequence[str],
    ready_file: Path | None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdout: Output = None,
    stderr: Output = None,
    start_new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``command`` (stdin from /dev/null) with ``TIDE_READY_FILE`` set to
    ``ready_file`` (removed first: an old one would say ready at once) in ``env``
    (default: this process's environment)."""
    child_env = dict(os.environ if env is None else env)
    if ready_file is not None:
        ready_file.unlink(missing_ok=True)
        child_env[READY_FILE_ENV] = str(ready_file)
    return subprocess.Popen(
        list(command),
        cwd=cwd,
        env=child_env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=start_new_session,
    )


def stderr_tail(path: Path | None, limit_chars: int = STDERR_TAIL_CHARS) -> str:
    """``"; stderr:\\n..."`` with the last ``limit_chars`` of the file, or ``""``."""
    if path is None:
        return ""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    cut = "...\n" if len(text) > limit_chars else ""
    return f"; stderr:\n{cut}{text[-limit_chars:]}"


def wait_ready(
    proc: subprocess.Popen[bytes],
    ready_file: Path,
    name: str,
    timeout_s: float = READY_TIMEOUT_S,
    *,
    stderr_path: Path | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """The ready file's JSON once it exists. NotReadyError if ``proc`` exits first or
    ``timeout_s`` passes (naming ``name``, with the tail of ``stderr_path``),
    WaitCancelled once ``cancelled()`` is true."""

    def ready() -> bool:
        if ready_file.exists():
            return True
        code = proc.poll()
        if code is not None:
            raise NotReadyError(
                f"{name} exited with status {code} before it was ready{stderr_tail(stderr_path)}"
            )
        if cancelled is not None and cancelled():
            raise WaitCancelled(f"stopped waiting for {name}")
        return False

    try:
        wait_until(ready, f"{name} to be ready", timeout_s, interval_s=POLL_INTERVAL_S)
    except WaitTimeout:
        raise NotReadyError(
            f"{name} not ready after {timeout_s:.3g} s{stderr_tail(stderr_path)}"
        ) from None
    info: dict[str, Any] = json.loads(ready_file.read_text(encoding="utf-8"))
    return info


def stop(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; the exit status."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


@dataclass(frozen=True)
class Ready:
    """A started process and what its ready file said."""

    proc: subprocess.Popen[bytes]
    info: dict[str, Any]

    @property
    def listen(self) -> str:
        return str(self.info["listen"])


@contextlib.contextmanager
def running(
    command: Sequence[str],
    ready_file: Path,
    name: str,
    timeout_s: float = READY_TIMEOUT_S,
    *,
    stderr_path: Path | None = None,
    stdout: Output = None,
    env: Mapping[str, str] | None = None,
    stop_timeout_s: float = STOP_TIMEOUT_S,
) -> Iterator[Ready]:
    """:func:`spawn` + :func:`wait_ready`; :func:`stop` on the way out. Its stderr goes
    to ``stderr_path`` when given (named in errors), else to this process's."""
    with contextlib.ExitStack() as files:
        err = files.enter_context(stderr_path.open("wb")) if stderr_path else None
        proc = spawn(command, ready_file, env=env, stdout=stdout, stderr=err)
    try:
        yield Ready(proc, wait_ready(proc, ready_file, name, timeout_s, stderr_path=stderr_path))
    finally:
        stop(proc, stop_timeout_s)

"""tide.spawn: start a real process with a ready file and wait for it (tide up, the
benches and the tests all start processes through it)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tide.spawn import NotReadyError, WaitCancelled, running, spawn, stop, wait_ready

# Writes {"listen": ..., "pid": ...} to $TIDE_READY_FILE whole (rename), then sleeps.
READY_THEN_SLEEP = """
import json, os, sys, time
path = os.environ["TIDE_READY_FILE"]
with open(path + ".tmp", "w") as out:
    json.dump({"listen": "127.0.0.1:1", "pid": os.getpid()}, out)
os.replace(path + ".tmp", path)
time.sleep(600)
"""


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_waits_for_the_ready_file_and_returns_it(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    with running(python(READY_THEN_SLEEP), ready, "the sleeper", 30.0) as process:
        assert process.info == {"listen": "127.0.0.1:1", "pid": process.proc.pid}
        assert process.listen == "127.0.0.1:1"
        assert process.proc.poll() is None
    assert process.proc.poll() is not None  # stopped on the way out


def test_a_process_that_exits_first_is_named_with_its_stderr_tail(tmp_path: Path) -> None:
    stderr_path = tmp_path / "stderr.log"
    code = "import sys; print('x' * 20000 + 'the reason', file=sys.stderr); sys.exit(3)"
    with (
        pytest.raises(NotReadyError) as raised,
        running(
            python(code), tmp_path / "ready.json", "the quitter", 30.0, stderr_path=stderr_path
        ),
    ):
        pass  # pragma: no cover
    message = str(raised.value)
    assert message.startswith("the quitter exited with status 3 before it was ready; stderr:")
    assert message.rstrip().endswith("the reason")
    assert len(message) < 9_000  # the tail, not all of it


def test_a_process_never_ready_times_out(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    proc = spawn(python("import time; time.sleep(600)"), ready)
    try:
        started = time.monotonic()
        with pytest.raises(NotReadyError, match=r"^the mute one not ready after 0\.3 s$"):
            wait_ready(proc, ready, "the mute one", 0.3)
        assert time.monotonic() - started >= 0.3
    finally:
        assert stop(proc, 10.0) != 0


def test_a_stale_ready_file_does_not_count(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    ready.write_text(json.dumps({"listen": "stale"}))
    proc = spawn(python("import time; time.sleep(600)"), ready)
    try:
        assert not ready.exists()
        with pytest.raises(NotReadyError, match="not ready"):
            wait_ready(proc, ready, "the mute one", 0.2)
    finally:
        stop(proc, 10.0)


def test_the_wait_can_be_cancelled(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    proc = spawn(python("import time; time.sleep(600)"), ready)
    try:
        with pytest.raises(WaitCancelled, match="stopped waiting for the mute one"):
            wait_ready(proc, ready, "the mute one", 30.0, cancelled=lambda: True)
    finally:
        stop(proc, 10.0)

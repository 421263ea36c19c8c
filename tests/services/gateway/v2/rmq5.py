"""Run rmq5_client.py (the official RocketMQ 5 Python client) against a cluster: in
.venv-rmq5 (``make rmq5-venv``, made here when missing), with a HOME of its own (the
client logs under ~/logs), answering the JSON lines it printed."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[4]
PROGRAM = Path(__file__).with_name("rmq5_client.py")
RMQ5_PYTHON = ROOT / ".venv-rmq5" / "bin" / "python"
RMQ5_STAMP = ROOT / ".venv-rmq5" / ".installed"  # the Makefile's: the client is installed
RMQ5_LOCK = ROOT / ".venv-rmq5.lock"
CLIENT_TIMEOUT_S = 180.0  # past the program's own deadline: a hang fails, not blocks


def client_python() -> Path:
    """The venv's python, the venv made first when missing: under a lock (both xdist
    workers may find it missing) and judged by the stamp (its python exists before the
    client is installed)."""
    if not RMQ5_STAMP.exists():
        with RMQ5_LOCK.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not RMQ5_STAMP.exists():
                subprocess.run(["make", "-C", str(ROOT), "rmq5-venv"], check=True)
    return RMQ5_PYTHON


def client_env(home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["HOME"] = str(home)
    return env


def run_client(
    home: Path, *args: str, check: bool = True, env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Run one program to its end; its printed objects (exit status checked). ``env``
    adds to the program's environment (RMQ5_ACCESS_KEY / RMQ5_SECRET_KEY: sign as that
    user)."""
    done = subprocess.run(
        [str(client_python()), str(PROGRAM), *args],
        env={**client_env(home), **(env or {})},
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
    )
    events = parse(done.stdout)
    if check and done.returncode != 0:
        raise AssertionError(
            f"rmq5_client {' '.join(args)} exited {done.returncode}\n"
            f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
        )
    return events


def start_client(home: Path, *args: str) -> subprocess.Popen[str]:
    """Start one program; read its lines with ``parse(process.stdout.read())``."""
    return subprocess.Popen(
        [str(client_python()), str(PROGRAM), *args],
        env=client_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def parse(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [event for event in events if event.get("event") == kind]

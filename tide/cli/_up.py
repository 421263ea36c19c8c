"""``tide up``: a local cluster on one machine, for development and tests.

Starts every service that exists as a child process on 127.0.0.1 with an embedded store
under ``--store-dir`` (default ``./.tide``), waits until each reports SERVING (through
its ready file), prints the endpoints, and stops them all cleanly on Ctrl-C or SIGTERM.
Children run in their own process group, so a terminal's Ctrl-C reaches only ``tide
up``, which then sends each child exactly one SIGTERM (a second signal would make a
service exit without its clean close).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.05
DEFAULT_SEGMENT_SIZE_BYTES = 128 << 20
DEFAULT_INDEX_MAX_ENTRIES = 1_000_000  # a 20 MB index file for a laptop-sized cluster


@dataclass
class Child:
    name: str
    command: list[str]
    ready_file: Path
    process: subprocess.Popen[bytes] | None = None
    endpoint: str = ""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "up",
        help="start a local cluster (Ctrl-C stops it)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--store-dir", default="./.tide", help="root of the embedded stores")
    parser.add_argument("--host", default="127.0.0.1", help="address every service listens on")
    parser.add_argument(
        "--storage-port", type=int, default=10911, help="storage gRPC port (0: any free port)"
    )
    parser.add_argument(
        "--dispatch-port", type=int, default=10921, help="dispatch gRPC port (0: any free port)"
    )
    parser.add_argument(
        "--index-max-entries",
        type=int,
        default=DEFAULT_INDEX_MAX_ENTRIES,
        help=f"entries per index file [unit: entries] (default: {DEFAULT_INDEX_MAX_ENTRIES}; "
        "RocketMQ's 20,000,000 makes a 420 MB file)",
    )
    parser.add_argument("--flush", choices=("sync", "async"), default="async", help="flush policy")
    parser.add_argument(
        "--segment-size-bytes",
        type=int,
        default=DEFAULT_SEGMENT_SIZE_BYTES,
        help=f"commitlog segment size [unit: bytes] (default: {DEFAULT_SEGMENT_SIZE_BYTES})",
    )
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    parser.set_defaults(handler=run)


def _children(args: argparse.Namespace) -> list[Child]:
    """Storage first, then dispatch on the same root (RocketMQ's directory layout: the
    dispatch owns consumequeue/ and index/ beside the storage's commitlog/)."""
    root = Path(args.store_dir).resolve()
    run_dir = root / "run"
    store = root / "store"
    storage = [
        sys.executable,
        "-m",
        "services.storage",
        "--store-dir",
        str(store),
        "--listen",
        f"{args.host}:{args.storage_port}",
        "--flush",
        args.flush,
        "--segment-size-bytes",
        str(args.segment_size_bytes),
        "--log-level",
        args.log_level,
    ]
    dispatch = [
        sys.executable,
        "-m",
        "services.dispatch",
        "--store-dir",
        str(store),
        "--listen",
        f"{args.host}:{args.dispatch_port}",
        "--storage",
        "{storage}",
        "--index-max-entries",
        str(args.index_max_entries),
        "--index-slot-count",
        str(max(1, args.index_max_entries // 4)),
        "--log-level",
        args.log_level,
    ]
    return [
        Child("storage", storage, run_dir / "storage.ready"),
        Child("dispatch", dispatch, run_dir / "dispatch.ready"),
    ]


class _Stop:
    """Set by SIGINT/SIGTERM."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum


def run(args: argparse.Namespace) -> int:
    children = _children(args)
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if not _start_all(children, stop):
            return 1
        _print_endpoints(children, Path(args.store_dir).resolve())
        return _watch(children, stop)
    finally:
        _stop_all(children)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_all(children: list[Child], stop: _Stop) -> bool:
    """Start each child once the ones before it are ready; ``{name}`` in a command
    stands for the endpoint of the earlier child ``name``."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    endpoints: dict[str, str] = {}
    for child in children:
        child.ready_file.parent.mkdir(parents=True, exist_ok=True)
        child.ready_file.unlink(missing_ok=True)
        env = {**os.environ, "TIDE_READY_FILE": str(child.ready_file)}
        command = [arg.format(**endpoints) for arg in child.command]
        child.process = subprocess.Popen(command, env=env, start_new_session=True)
        while not child.ready_file.exists():
            assert child.process is not None
            code = child.process.poll()
            if code is not None:
                print(
                    f"tide up: {child.name} exited with status {code} while starting "
                    "(its log is above)",
                    file=sys.stderr,
                )
                return False
            if stop.signal is not None:
                return False
            if time.monotonic() > deadline:
                print(
                    f"tide up: {child.name} not ready after {READY_TIMEOUT_S:.0f} s",
                    file=sys.stderr,
                )
                return False
            time.sleep(POLL_INTERVAL_S)
        child.endpoint = str(json.loads(child.ready_file.read_text())["listen"])
        endpoints[child.name] = child.endpoint
    return True


def _print_endpoints(children: list[Child], root: Path) -> None:
    print(f"\nTide is up (store under {root}):", flush=True)
    for child in children:
        print(f"  {child.name:<10} {child.endpoint}", flush=True)
    print("Try: grpcurl -plaintext", children[0].endpoint, "list", flush=True)
    print("Ctrl-C stops the cluster.\n", flush=True)


def _watch(children: list[Child], stop: _Stop) -> int:
    while stop.signal is None:
        for child in children:
            assert child.process is not None
            code = child.process.poll()
            if code is not None:
                print(
                    f"tide up: {child.name} exited unexpectedly with status {code}; "
                    "stopping the others",
                    file=sys.stderr,
                )
                return 1
        time.sleep(POLL_INTERVAL_S * 4)
    print(f"\ntide up: {signal.Signals(stop.signal).name}: stopping", file=sys.stderr, flush=True)
    return 0


def _stop_all(children: list[Child]) -> None:
    """SIGTERM each running child once (reverse start order), wait, SIGKILL stragglers."""
    running = [c for c in reversed(children) if c.process and c.process.poll() is None]
    for child in running:
        assert child.process is not None
        child.process.send_signal(signal.SIGTERM)
    for child in running:
        assert child.process is not None
        try:
            code = child.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(
                f"tide up: {child.name} did not stop in {STOP_TIMEOUT_S:.0f} s; killing it",
                file=sys.stderr,
            )
            child.process.kill()
            code = child.process.wait()
        if code != 0:
            print(f"tide up: {child.name} stopped with status {code}", file=sys.stderr)

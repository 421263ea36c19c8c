"""Issue 21 target 2 (target 1 with ``--consumer``), A/B: versions of the code alternating
on fresh clusters, each process's CPU per published message, and the ceiling's chain in
the same run.

    git archive <commit> tide services bench | tar -x -C /tmp/old      # the old code
    cp tide/format/_ccore*.so /tmp/old/tide/format/                    # its core, if same
    python -m bench.produce_ab --version old=/tmp/old --version new=. --rounds 3

Each round runs every version in turn (the order reversed every other round), each on a
fresh ``tide up`` (``--flush async``, no console; the services import the version's
code: ``PYTHONPATH``), then ``bench.hop_ceiling --cases chain``. A version's run is
``tide bench run 1-topic-4-queues-128b-batch100-stream --set consumers_per_topic=0``
(warm-up 3 s, 10 s measured) from this tree's load generator; the CPU of each service
(``/proc/PID/stat``) over the whole bench divided by every message it published
(warm-up included). One JSON line per run on stdout; the load average with each.

With ``--consumer`` the runs are target 1's: the workload's consumer keeps up (no
``consumers_per_topic=0``) and the ceiling runs ``chain-consume`` with the consumer's
largest pull (``--pull-batch-max``: the workload's ``pull_batch_max``); each line then
has the run's end-to-end p99 too. One version is enough for a target's ratio
(``--version new=.``): a round is that version, then the ceiling.

    python -m bench.produce_ab --version new=. --rounds 4 --consumer    # target 1

For a target's ratio, ``bench.interleave`` measures Tide and the ceiling up at once,
window by window, each process's CPU over each window exactly; this module compares
versions of the code, each on its own fresh cluster (``bench.interleave --versions``
compares two of them up at once, window by window).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tide.bench import load_workload
from tide.bench._run import process_cpu_s

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = REPO / "bench" / "workloads" / "1-topic-4-queues-128b-batch100-stream.yaml"
SERVICES = ("gateway", "storage", "dispatch", "nameserver")
START_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 300.0


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _children(pid: int) -> dict[int, str]:
    """Every descendant of ``pid``: its command line."""
    listing = subprocess.run(
        ["ps", "-e", "-o", "pid=,ppid=,args="], capture_output=True, text=True, check=True
    ).stdout
    rows = [line.split(None, 2) for line in listing.splitlines()]
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for row in rows:
            if len(row) == 3 and int(row[1]) == parent:
                found[int(row[0])] = row[2]
                frontier.append(int(row[0]))
    return found


def _wait_for_port(port: int, up: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if up.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the cluster did not start (tide up: {up.returncode})")
        time.sleep(0.2)


def bench_command(
    gateway_port: int,
    *,
    consumer: bool,
    warmup_s: float = 3,
    duration_s: float = 10,
    workload: Path = WORKLOAD,
    sets: Sequence[str] = (),
) -> list[str]:
    """The load generator's run: target 2's (producers only) or, with ``consumer``, 1's;
    or ``workload``'s with its consumers, ``sets`` its ``--set`` options."""
    command = [
        sys.executable, "-m", "tide.cli", "bench", "run", str(workload), "--gateway",
        f"127.0.0.1:{gateway_port}", "--json", "--quiet", "--set", f"warmup_s={warmup_s:g}",
        "--set", f"duration_s={duration_s:g}",
    ]  # fmt: skip
    for option in sets:
        command += ["--set", option]
    return command if consumer else [*command, "--set", "consumers_per_topic=0"]


def ceiling_args(*, consumer: bool) -> list[str]:
    """The ceiling's case in the same shape: ``chain``, or ``chain-consume`` with the load
    generator consumer's largest pull (the stream workload's ``pull_batch_max``)."""
    if not consumer:
        return ["--cases", "chain"]
    pull_batch_max = load_workload(str(WORKLOAD)).pull_batch_max
    return ["--cases", "chain-consume", "--pull-batch-max", str(pull_batch_max)]


def ceiling_command(json_out: Path, *, consumer: bool) -> list[str]:
    """``bench.hop_ceiling`` in the same shape, on fresh relays."""
    return [
        sys.executable, "-m", "bench.hop_ceiling", *ceiling_args(consumer=consumer),
        "--warmup-s", "3", "--duration-s", "10", "--json-out", str(json_out),
    ]  # fmt: skip


@dataclass(frozen=True)
class Cluster:
    """A running ``tide up``: its gateway's port and each service's process id."""

    gateway_port: int
    pids: dict[str, int]


@contextlib.contextmanager
def cluster(code: Path, first_port: int, store: Path) -> Iterator[Cluster]:
    """A fresh ``tide up --flush async`` (no console) of the code at ``code`` on ``store``,
    ports from ``first_port`` (31 of them); stopped on the way out."""
    ports = {"namesrv": first_port, "storage": first_port + 10, "dispatch": first_port + 20}
    gateway_port = first_port + 30
    env = dict(os.environ, PYTHONPATH=str(code.resolve()))
    command = [sys.executable, "-m", "tide.cli", "up", "--store-dir", str(store)]
    for service, port in ports.items():
        command += [f"--{service}-port", str(port)]
    command += ["--gateway-port", str(gateway_port), "--no-console", "--flush", "async"]
    # From a neutral directory, so the services import the version's code, not this tree.
    up = subprocess.Popen(
        command, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for_port(gateway_port, up)
        pids = {
            service: pid
            for pid, args in _children(up.pid).items()
            for service in SERVICES
            if f"services.{service}" in args
        }
        yield Cluster(gateway_port, pids)
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(START_TIMEOUT_S)


def run_version(
    name: str, code: Path, first_port: int, store: Path, *, consumer: bool = False
) -> dict[str, Any]:
    """One target-2 (``consumer``: target-1) run of the version whose code is at ``code``."""
    with cluster(code, first_port, store) as up:
        load_before, started = loadavg(), time.monotonic()
        before = {service: process_cpu_s(pid) for service, pid in up.pids.items()}
        bench = subprocess.run(
            bench_command(up.gateway_port, consumer=consumer),
            cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=True,
        )  # fmt: skip
        after = {service: process_cpu_s(pid) for service, pid in up.pids.items()}
    report = json.loads(bench.stdout)
    published = report["totals"]["published"]
    row: dict[str, Any] = {
        "version": name,
        "publish_msgs_per_s": report["publish"]["msgs_per_s"],
        "cpu_us_per_msg": {
            service: round((after[service] - before[service]) / published * 1e6, 2)
            for service in up.pids
        },
        "wall_s": round(time.monotonic() - started, 1),
        "load": [load_before, loadavg()],
    }
    # The load generator's own (its measured window over its messages), as the chain's
    # row has the relays' client.
    row["cpu_us_per_msg"]["client"] = report["client_cpu"]["us_per_msg"]
    if consumer:
        row["e2e_p99_ms"] = report["e2e_latency_ms"]["p99"]
    return row


def run_chain(*, consumer: bool = False) -> dict[str, Any]:
    """The ceiling's chain (relays in the place of Tide's services), same shape."""
    with tempfile.TemporaryDirectory() as out:
        path = Path(out) / "chain.json"
        subprocess.run(
            ceiling_command(path, consumer=consumer),
            cwd=REPO, capture_output=True, timeout=RUN_TIMEOUT_S, check=True,
        )  # fmt: skip
        result: dict[str, Any] = json.loads(path.read_text())["results"][0]
    # The relays' CPU covers warm-up and window; their messages, the window's: per
    # message over both at the window's rate (an estimate, as docs/benchmarks.md says).
    rate = result["publish_msgs_per_s"]
    row: dict[str, Any] = {
        "version": "chain-consume" if consumer else "chain",
        "publish_msgs_per_s": rate,
        "cpu_us_per_msg": {
            name: round(cpu / (rate * 13.0) * 1e6, 2) for name, cpu in result["cpu_s"].items()
        },
        "load": loadavg(),
    }
    if consumer:
        row["e2e_p99_ms"] = result["e2e_p99_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--version", action="append", required=True, metavar="NAME=DIR",
        help="a version's code (a directory holding tide/ and services/); give two or more",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="rounds (>= 1)")
    parser.add_argument("--port", type=int, default=32200, help="first of 31 ports used")
    parser.add_argument(
        "--consumer", action="store_true",
        help="target 1: the workload's consumer keeps up; the ceiling's chain-consume",
    )  # fmt: skip
    args = parser.parse_args()
    versions = [(name, Path(path)) for name, _, path in (v.partition("=") for v in args.version)]
    for rnd in range(max(1, args.rounds)):
        order = versions if rnd % 2 == 0 else versions[::-1]
        for name, code in order:
            store = Path(tempfile.mkdtemp(prefix=f"produce-ab-{name}-"))
            try:
                row = run_version(name, code, args.port, store, consumer=args.consumer)
            finally:
                shutil.rmtree(store, ignore_errors=True)
            print(json.dumps({"round": rnd, **row}), flush=True)
        print(json.dumps({"round": rnd, **run_chain(consumer=args.consumer)}), flush=True)


if __name__ == "__main__":
    main()

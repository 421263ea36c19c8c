"""The consume path's CPU per message, per process: a running Tide cluster's storage,
dispatch and gateway (``/proc/PID/stat`` utime + stime) and the load generator (this
process's children), over ``tide bench run`` of the stream shape with one consumer and
without (``consumers_per_topic=0``), alternating, ``--rounds`` times each.

    python -m bench.consume_cpu --gateway 127.0.0.1:8081 --pids STORAGE,DISPATCH,GATEWAY

CPU is over the whole run (warm-up, window, drain) and divided by every message
published in it; the consume path's own cost is a process's figure with the consumer
minus without. One JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from tide.bench._run import loadavg, process_cpu_s

WORKLOAD = "1-topic-4-queues-128b-batch100-stream"
NAMES = ("storage", "dispatch", "gateway")


def _children_cpu_s() -> float:
    times = os.times()
    return times.children_user + times.children_system


def run_once(args: argparse.Namespace, pids: dict[str, int], consumer: bool) -> dict[str, Any]:
    """One ``tide bench run``: its result and each process's us of CPU per message."""
    command = [sys.executable, "-m", "tide.cli", "bench", "run", WORKLOAD, "--gateway"]
    command += [args.gateway, "--json", "--set", f"warmup_s={args.warmup_s}"]
    command += ["--set", f"duration_s={args.duration_s}"]
    if not consumer:
        command += ["--set", "consumers_per_topic=0"]
    before = {name: process_cpu_s(pid) for name, pid in pids.items()}
    children_before = _children_cpu_s()
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    cpu = {name: process_cpu_s(pid) - before[name] for name, pid in pids.items()}
    cpu["loadgen"] = _children_cpu_s() - children_before
    result = json.loads(out.stdout)
    published = max(1, int(result["totals"]["published"]))
    return {
        "consumer": consumer,
        "loadavg": loadavg(),
        "publish_msgs_per_s": result["publish"]["msgs_per_s"],
        "consume_msgs_per_s": result["consume"]["msgs_per_s"],
        "e2e_p99_ms": result["e2e_latency_ms"].get("p99"),
        "published": published,
        "us_per_msg": {name: round(1e6 * value / published, 2) for name, value in cpu.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--pids", required=True, help="storage,dispatch,gateway PIDs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--duration-s", type=float, default=10.0)
    args = parser.parse_args()
    pids = dict(zip(NAMES, (int(pid) for pid in args.pids.split(",")), strict=True))
    for _ in range(args.rounds):
        for consumer in (True, False):
            print(json.dumps(run_once(args, pids, consumer)), flush=True)


if __name__ == "__main__":
    main()

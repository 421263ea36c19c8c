"""Transactional produce (half + commit) per second, beside the normal produce rate.

    python -m bench.transactions                        # 20 s per phase, 4 threads
    python -m bench.transactions --duration-s 5 --threads 2 --json

Starts real processes on a fresh store (bench.gateway_produce_pull's ``service``): a name
server, one broker (storage + dispatch, registered) and a gateway, and creates a MIXED
topic. Then, for ``--duration-s`` each, ``--threads`` threads of one ``tide.client``
Producer send 128-byte messages one at a time:

* ``normal``: ``Producer.send`` (one Produce call per message);
* ``transactional``: ``Producer.send_transaction`` with a local transaction that commits
  at once (a Produce of the half, then an EndTransaction that writes the commit copy and
  the op record in one Append).

Reported: messages per second of each, their ratio, each process's CPU per message
(``/proc/<pid>/stat``), and that every transaction committed.
The phases alternate normal, transactional, normal, transactional (``--rounds`` 2) on the
same cluster, so both rates come from the same run and the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from bench.gateway_produce_pull import PROCESSES, free_port, loadavg, process_cpu_s, service
from tide.client import Admin, Message, Producer, SendResult, TransactionResolution

TOPIC = "T_bench_tx"
GROUP = "PG_bench_tx"
BROKER = "broker-a"
BODY = b"x" * 128
MAX_THREADS = 64
MAX_DURATION_S = 3600.0


def _commit(message: Message, half: SendResult) -> TransactionResolution:
    return TransactionResolution.COMMIT


def cpu_s() -> dict[str, float]:
    """CPU seconds used so far by each service process and by this client process."""
    used = {name: process_cpu_s(proc.pid) for name, proc in PROCESSES.items()}
    times = os.times()
    used["client"] = times.user + times.system
    return used


def phase(
    producer: Producer,
    threads: int,
    duration_s: float,
    transactional: bool,
    cpu_us: dict[str, list[float]] | None = None,
) -> float:
    """Messages per second sent by ``threads`` threads for ``duration_s``; with
    ``cpu_us``, each process's CPU per message (us) is appended to it."""
    before = cpu_s()
    counts = [0] * threads
    failures: list[str] = []
    deadline = time.monotonic() + duration_s

    def loop(index: int) -> None:
        send: Callable[[], object]
        if transactional:

            def send() -> object:
                outcome = producer.send_transaction(Message(TOPIC, BODY), _commit)
                if outcome.committed is None:
                    failures.append(outcome.error or "not committed")
                return outcome

        else:

            def send() -> object:
                return producer.send(TOPIC, BODY)

        while time.monotonic() < deadline:
            send()
            counts[index] += 1

    started = time.monotonic()
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed_s = time.monotonic() - started
    if failures:
        raise RuntimeError(f"{len(failures)} transactions not committed: {failures[0]}")
    sent = sum(counts)
    if cpu_us is not None and sent:
        after = cpu_s()
        for name, used_s in after.items():
            spent_s = used_s - before.get(name, used_s)
            cpu_us.setdefault(name, []).append(round(spent_s / sent * 1e6))
    return sent / elapsed_s


def run(args: argparse.Namespace) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="tide-tx-bench-"))
    before = loadavg()
    try:
        with ExitStack() as stack:
            namesrv = stack.enter_context(service("nameserver", ["--listen", "127.0.0.1:0"], root))
            storage_port, dispatch_port = free_port(), free_port()
            store = root / "store"
            storage = f"127.0.0.1:{storage_port}"
            stack.enter_context(
                service(
                    "storage",
                    [
                        "--listen",
                        storage,
                        "--store-dir",
                        str(store),
                        "--namesrv",
                        namesrv,
                        "--broker-name",
                        BROKER,
                        "--dispatch-address",
                        f"127.0.0.1:{dispatch_port}",
                    ],
                    root,
                )
            )
            stack.enter_context(
                service(
                    "dispatch",
                    [
                        "--listen",
                        f"127.0.0.1:{dispatch_port}",
                        "--store-dir",
                        str(store),
                        "--storage",
                        storage,
                    ],
                    root,
                )
            )
            gateway = stack.enter_context(
                service("gateway", ["--listen", "127.0.0.1:0", "--namesrv", namesrv], root)
            )
            with Admin(gateway) as admin:
                admin.create_topic(TOPIC, read_queue_nums=4, message_type="MIXED")
            rates: dict[str, list[float]] = {"normal": [], "transactional": []}
            cpu: dict[str, dict[str, list[float]]] = {"normal": {}, "transactional": {}}
            with Producer(gateway, producer_group=GROUP) as producer:
                phase(producer, args.threads, 2.0, transactional=True)  # warm up both paths
                phase(producer, args.threads, 2.0, transactional=False)
                for _ in range(args.rounds):
                    for name in ("normal", "transactional"):
                        rate = phase(
                            producer,
                            args.threads,
                            args.duration_s,
                            name == "transactional",
                            cpu[name],
                        )
                        rates[name].append(rate)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    normal = sum(rates["normal"]) / len(rates["normal"])
    transactional = sum(rates["transactional"]) / len(rates["transactional"])
    return {
        "threads": args.threads,
        "duration_s": args.duration_s,
        "rounds": args.rounds,
        "normal_msgs_per_s": [round(rate) for rate in rates["normal"]],
        "transactional_msgs_per_s": [round(rate) for rate in rates["transactional"]],
        "transactional_to_normal": round(transactional / normal, 3),
        # CPU per message of each process, us, per round (/proc/<pid>/stat; the client:
        # this process).
        "cpu_us_per_msg": cpu,
        "loadavg": {"before": before, "after": loadavg()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    if not 1 <= args.threads <= MAX_THREADS or not 0 < args.duration_s <= MAX_DURATION_S:
        parser.error(f"--threads in 1..{MAX_THREADS}, --duration-s in (0, {MAX_DURATION_S}]")
    if not 1 <= args.rounds <= 10:
        parser.error("--rounds in 1..10")
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, value in report.items():
            print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replication benchmark: catch-up throughput and produce latency by broker role.

    python -m bench.replication                     # ~1 min
    python -m bench.replication --fill-mb 128 --duration-s 5

Cases, each on real storage processes over real gRPC (localhost):

* ``catch-up``: a master is filled with ``--fill-mb`` of messages, then an empty slave
  starts; the time from its start until its max offset equals the master's gives MB/s
  (``--ha-batch-bytes`` chunks).
* ``produce``: one client, ``--inflight`` Append calls in flight, batches of ``--batch``
  messages of ``--size`` bytes, for ``--duration-s``: ASYNC_MASTER with a slave and
  SYNC_MASTER with a slave (the call answers after the slave's ack), each with
  ``--flush async``. Latency is per call.

Results go to stdout as a Markdown table and to ``bench/results/replication.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from tide.spawn import running
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc
from tide.waiting import wait_until

RESULTS = Path(__file__).resolve().parent / "results" / "replication.json"
READY_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 600.0
SEGMENT_BYTES = 64 << 20


@dataclass
class Result:
    case: str
    role: str
    msgs_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float


@contextmanager
def storage(root: Path, *args: str) -> Iterator[str]:
    """A storage process; yields its address."""
    ready = root.with_suffix(".ready")
    ready.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "services.storage",
        "--store-dir",
        str(root),
        "--listen",
        "127.0.0.1:0",
        "--segment-size-bytes",
        str(SEGMENT_BYTES),
        "--log-level",
        "warning",
        *args,
    ]
    with running(cmd, ready, f"storage {root}", READY_TIMEOUT_S, stop_timeout_s=60.0) as process:
        yield process.listen


def status(address: str) -> pb.StorageStatus:
    with grpc.insecure_channel(address) as channel:
        result: pb.StorageStatus = pb_grpc.StorageStub(channel).GetStatus(
            pb.GetStatusRequest(), timeout=10
        )
        return result


def request(size: int, batch: int) -> pb.AppendRequest:
    return pb.AppendRequest(
        messages=[pb.Message(topic="Bench", queue_id=i % 4, body=b"x" * size) for i in range(batch)]
    )


async def produce(
    address: str, req: pb.AppendRequest, duration_s: float, inflight: int
) -> tuple[list[float], int, float]:
    """Calls for ``duration_s``; returns (latencies s, non-PUT_OK results, elapsed s)."""
    latencies: list[float] = []
    bad = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.StorageStub(channel)
        await stub.Append(req, timeout=30)  # warm up (creates the topic)
        start = time.perf_counter()
        deadline = start + duration_s

        async def caller() -> None:
            nonlocal bad
            while time.perf_counter() < deadline:
                began = time.perf_counter()
                response = await stub.Append(req, timeout=30)
                latencies.append(time.perf_counter() - began)
                bad += sum(1 for r in response.results if r.status != pb.PUT_OK)

        await asyncio.gather(*(caller() for _ in range(inflight)))
        return latencies, bad, time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def catch_up(root: Path, fill_mb: int, batch_bytes: int) -> Result:
    req = request(1024, 64)
    with storage(root / "m") as master:
        with grpc.insecure_channel(master) as channel:
            stub = pb_grpc.StorageStub(channel)
            while status(master).max_offset < fill_mb << 20:
                stub.Append(req, timeout=30)
        total = status(master).max_offset
        began = time.perf_counter()
        slave_args = ("--role", "SLAVE", "--broker-id", "1", "--master", master)
        with storage(root / "s", *slave_args, "--ha-batch-bytes", str(batch_bytes)) as slave:
            wait_until(
                lambda: status(slave).max_offset >= total,
                "the slave to catch up",
                CATCH_UP_TIMEOUT_S,
                interval_s=0.05,
            )
            elapsed = time.perf_counter() - began
    return Result("catch-up", "SLAVE", 0.0, total / 1e6 / elapsed, 0.0, 0.0)  # bytes only


def produce_case(
    root: Path, role: str, size: int, batch: int, duration_s: float, inflight: int
) -> Result:
    shutil.rmtree(root, ignore_errors=True)
    with storage(root / "m", "--role", role) as master:
        slave_args = ("--role", "SLAVE", "--broker-id", "1", "--master", master)
        with storage(root / "s", *slave_args):
            wait_until(
                lambda: status(master).replication.slaves,
                "the slave to connect",
                READY_TIMEOUT_S,
                interval_s=0.05,
            )
            latencies, bad, elapsed = asyncio.run(
                produce(master, request(size, batch), duration_s, inflight)
            )
    if bad:
        raise RuntimeError(f"{bad} messages were not PUT_OK ({role})")
    msgs = len(latencies) * batch
    return Result(
        "produce",
        role,
        msgs / elapsed,
        msgs * size / 1e6 / elapsed,
        percentile(latencies, 0.50),
        percentile(latencies, 0.99),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fill-mb", type=int, default=256)
    parser.add_argument("--ha-batch-bytes", type=int, default=32 * 1024)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--inflight", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=10.0)
    args = parser.parse_args()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="tide-bench-repl-") as tmp:
        root = Path(tmp)
        results.append(catch_up(root / "catch-up", args.fill_mb, args.ha_batch_bytes))
        for role in ("ASYNC_MASTER", "SYNC_MASTER"):
            results.append(
                produce_case(
                    root / role, role, args.size, args.batch, args.duration_s, args.inflight
                )
            )
    print("| case | role | msgs/s | MB/s | p50 ms | p99 ms |")
    print("|---|---|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r.case} | {r.role} | {r.msgs_per_s:,.0f} | {r.mb_per_s:.1f} | "
            f"{r.p50_ms:.2f} | {r.p99_ms:.2f} |"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "args": vars(args),
                "results": [asdict(r) for r in results],
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()

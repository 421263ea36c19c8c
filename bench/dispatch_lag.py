"""Dispatch lag behind storage under a steady produce load (real processes).

    python -m bench.dispatch_lag --rate 20000 --duration-s 10

Starts a storage and a dispatch process on a fresh store (dispatch co-located, as
``tide up`` runs them), produces 128-byte messages with one key each at ``--rate``
messages/s in batches of 100, and samples the storage's max offset against the
dispatch's dispatched offset every 50 ms: the lag in bytes and in records (at the
record size). At the end it reports how long the dispatch took to catch up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from tide.v1 import dispatch_pb2 as dpb
from tide.v1 import dispatch_pb2_grpc as dpb_grpc
from tide.v1 import storage_pb2 as spb
from tide.v1 import storage_pb2_grpc as spb_grpc

BATCH = 100
SAMPLE_INTERVAL_S = 0.05
READY_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 120.0


@contextmanager
def service(name: str, args: list[str], run_dir: Path) -> Iterator[str]:
    ready = run_dir / f"{name}.ready"
    cmd = [sys.executable, "-m", f"services.{name}", "--listen", "127.0.0.1:0", *args]
    proc = subprocess.Popen(cmd, env={**os.environ, "TIDE_READY_FILE": str(ready)})
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start (exit {proc.poll()})")
            time.sleep(0.05)
        yield str(json.loads(ready.read_text())["listen"])
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def percentile(values: list[int], fraction: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=20_000, help="messages/s to produce")
    parser.add_argument("--duration-s", type=float, default=10.0, help="produce for, seconds")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-lag-"))
    store = root / "store"
    try:
        with (
            service(
                "storage", ["--store-dir", str(store), "--log-level", "warning"], root
            ) as s_addr,
            service(
                "dispatch",
                ["--store-dir", str(store), "--storage", s_addr, "--log-level", "warning"],
                root,
            ) as d_addr,
        ):
            run(s_addr, d_addr, args.rate, args.duration_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(storage_addr: str, dispatch_addr: str, rate: int, duration_s: float) -> None:
    storage = spb_grpc.StorageStub(grpc.insecure_channel(storage_addr))
    dispatch = dpb_grpc.DispatchStub(grpc.insecure_channel(dispatch_addr))
    body = b"x" * 128
    lags: list[int] = []
    record_bytes = 0
    sent = 0
    start = time.monotonic()
    next_sample = start
    while (now := time.monotonic()) - start < duration_s:
        if sent < (now - start) * rate:
            request = spb.AppendRequest(
                messages=[
                    spb.Message(topic="LagTopic", queue_id=i % 4, body=body, keys=[f"k{sent + i}"])
                    for i in range(BATCH)
                ]
            )
            reply = storage.Append(request)
            record_bytes = reply.results[0].size
            sent += BATCH
        if now >= next_sample:
            status = dispatch.GetStatus(dpb.GetDispatchStatusRequest())
            lags.append(max(0, status.storage_max_offset - status.dispatched_offset))
            next_sample = now + SAMPLE_INTERVAL_S
        elif sent >= (now - start) * rate:
            time.sleep(0.001)
    produced_s = time.monotonic() - start
    end = storage.GetStatus(spb.GetStatusRequest()).max_offset
    caught_up_s = catch_up(dispatch, end)
    print(
        f"produced {sent:,} messages in {produced_s:.1f} s ({sent / produced_s:,.0f}/s), "
        f"{record_bytes} B records"
    )
    print(
        f"lag over {len(lags)} samples: p50 {percentile(lags, 0.5):,} B "
        f"({percentile(lags, 0.5) // max(1, record_bytes):,} records), "
        f"p99 {percentile(lags, 0.99):,} B, max {max(lags, default=0):,} B"
    )
    print(f"caught up {caught_up_s:.2f} s after the last append")


def catch_up(dispatch: dpb_grpc.DispatchStub, end: int) -> float:
    start = time.monotonic()
    while time.monotonic() - start < CATCH_UP_TIMEOUT_S:
        if dispatch.GetStatus(dpb.GetDispatchStatusRequest()).dispatched_offset >= end:
            return time.monotonic() - start
        time.sleep(0.01)
    raise RuntimeError(f"dispatch did not catch up within {CATCH_UP_TIMEOUT_S} s")


if __name__ == "__main__":
    main()

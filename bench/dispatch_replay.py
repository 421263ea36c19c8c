"""Dispatch replay of an existing commitlog, with real processes.

    python -m bench.dispatch_replay --records 500000

Starts a storage process, appends ``--records`` messages of 128 bytes with one key each
(batches of 1,000 over 8 queues, round robin), then starts a dispatch process on an
empty directory: it rebuilds the consume queues and the index from the whole commitlog
through the Tail stream. Reports records/s from the dispatch's start (its ready file)
to the moment its dispatched offset reaches the storage's max offset, and the dispatch
process's CPU time over that span.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import grpc

from bench.dispatch_lag import service
from tide.v1 import dispatch_pb2 as dpb
from tide.v1 import dispatch_pb2_grpc as dpb_grpc
from tide.v1 import storage_pb2 as spb
from tide.v1 import storage_pb2_grpc as spb_grpc

BATCH = 1_000
QUEUES = 8
REPLAY_TIMEOUT_S = 600.0
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def fill(storage_addr: str, records: int) -> int:
    """Append ``records`` messages; return the storage's max offset."""
    storage = spb_grpc.StorageStub(grpc.insecure_channel(storage_addr))
    topic = spb.TopicConfig(
        topic_name="ReplayTopic", read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6
    )
    storage.UpsertTopic(spb.UpsertTopicRequest(topic=topic), timeout=60)
    body = b"x" * 128
    for start in range(0, records, BATCH):
        request = spb.AppendRequest(
            messages=[
                spb.Message(topic="ReplayTopic", queue_id=i % QUEUES, body=body, keys=[f"k{i}"])
                for i in range(start, min(start + BATCH, records))
            ]
        )
        storage.Append(request, timeout=60)
    max_offset: int = storage.GetStatus(spb.GetStatusRequest(), timeout=60).max_offset
    return max_offset


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S  # utime + stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=500_000, help="messages to replay")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-replay-"))
    store = root / "store"
    try:
        with service(
            "storage", ["--store-dir", str(store), "--log-level", "warning"], root
        ) as s_addr:
            end = fill(s_addr, args.records)
            dispatch_args = ["--store-dir", str(root / "dispatch"), "--storage", s_addr]
            with service("dispatch", [*dispatch_args, "--log-level", "warning"], root) as d_addr:
                pid = int(json.loads((root / "dispatch.ready").read_text())["pid"])
                replay(d_addr, pid, end, args.records)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def replay(dispatch_addr: str, pid: int, end: int, records: int) -> None:
    """From the dispatch's ready file (it has reconciled and follows) to caught up."""
    dispatch = dpb_grpc.DispatchStub(grpc.insecure_channel(dispatch_addr))
    started, cpu_before = time.monotonic(), cpu_s(pid)
    while time.monotonic() - started < REPLAY_TIMEOUT_S:
        status = dispatch.GetStatus(dpb.GetDispatchStatusRequest(), timeout=60)
        if status.dispatched_offset >= end:
            elapsed_s = time.monotonic() - started
            used_s = cpu_s(pid) - cpu_before
            print(
                f"replayed {records:,} records ({end:,} B) in {elapsed_s:.2f} s: "
                f"{records / elapsed_s:,.0f} records/s; dispatch CPU {used_s:.2f} s "
                f"({records / max(used_s, 1e-9):,.0f} records per CPU second)"
            )
            return
        time.sleep(0.01)
    raise RuntimeError(f"dispatch did not finish the replay within {REPLAY_TIMEOUT_S} s")


if __name__ == "__main__":
    main()

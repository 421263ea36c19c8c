"""Dispatch replay of an existing commitlog, with real processes.

    python -m bench.dispatch_replay --records 500000 [--runs 3] [--chunk-bytes N]

Starts a storage process, appends ``--records`` messages of 128 bytes with one key each
(batches of 1,000 over 8 queues, round robin), then starts a dispatch process on an
empty directory: it rebuilds the consume queues and the index from the whole commitlog
through the Tail stream. Reports records/s from the dispatch's start (its ready file)
to the moment its dispatched offset reaches the storage's max offset (``GetStatus``
every 10 ms, each call also costing the dispatch a call to the storage; ``--watch``
tells the end from the dispatch's ``WatchArrivals`` stream instead: every queue holds
its records), and the CPU time (user, system) and page faults of the dispatch and the
CPU time of the storage process over that span (``/proc/PID/stat``).
``--runs`` replays the same commitlog that many times, each with a fresh dispatch
process and directory. ``--chunk-bytes`` sets the storage's default Tail chunk size
(``--tail-max-chunk-bytes``: only for a dispatch that asks for the default, as before
``dispatcher.TAIL_CHUNK_BYTES``); ``--spy OUT`` records the first run's dispatch process
with py-spy (raw format, ``--gil``: only the thread holding the GIL) into ``OUT``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
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
TOPIC = "ReplayTopic"
REPLAY_TIMEOUT_S = 600.0
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def fill(storage_addr: str, records: int) -> int:
    """Append ``records`` messages; return the storage's max offset."""
    storage = spb_grpc.StorageStub(grpc.insecure_channel(storage_addr))
    topic = spb.TopicConfig(
        topic_name=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6
    )
    storage.UpsertTopic(spb.UpsertTopicRequest(topic=topic), timeout=60)
    body = b"x" * 128
    for start in range(0, records, BATCH):
        request = spb.AppendRequest(
            messages=[
                spb.Message(topic=TOPIC, queue_id=i % QUEUES, body=body, keys=[f"k{i}"])
                for i in range(start, min(start + BATCH, records))
            ]
        )
        storage.Append(request, timeout=60)
    max_offset: int = storage.GetStatus(spb.GetStatusRequest(), timeout=60).max_offset
    return max_offset


def cpu_s(pid: int, task: str = "") -> float:
    return sum(user_system_s(pid, task))


def user_system_s(pid: int, task: str = "") -> tuple[float, float]:
    """(user, system) CPU seconds of a process (or one of its threads)."""
    fields = _stat(pid, task)
    return int(fields[11]) / CLOCK_TICKS_PER_S, int(fields[12]) / CLOCK_TICKS_PER_S


def minor_faults(pid: int) -> int:
    return int(_stat(pid)[7])


def _stat(pid: int, task: str = "") -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first)."""
    stat = Path(f"/proc/{pid}/task/{task}/stat" if task else f"/proc/{pid}/stat")
    return stat.read_text().rsplit(")", 1)[1].split()


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user, system) by thread name, threads of one name added up."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        used = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S
        out[name] = out.get(name, 0.0) + used
    return out


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=500_000, help="messages to replay")
    parser.add_argument("--runs", type=int, default=1, help="replays of the same commitlog")
    parser.add_argument(
        "--chunk-bytes", type=int, default=0, help="storage's Tail chunk size (0: its default)"
    )
    parser.add_argument(
        "--threads", action="store_true", help="also the dispatch's CPU per thread name"
    )
    parser.add_argument("--spy", default="", help="py-spy the first run's dispatch into this file")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="tell the end from WatchArrivals rather than GetStatus every 10 ms",
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-replay-"))
    store = root / "store"
    storage_args = ["--store-dir", str(store), "--log-level", "warning"]
    if args.chunk_bytes:
        storage_args += ["--tail-max-chunk-bytes", str(args.chunk_bytes)]
    try:
        with service("storage", storage_args, root) as s_addr:
            storage_pid = int(json.loads((root / "storage.ready").read_text())["pid"])
            end = fill(s_addr, args.records)
            for run in range(args.runs):
                shutil.rmtree(root / "dispatch", ignore_errors=True)
                (root / "dispatch.ready").unlink(missing_ok=True)
                dispatch_args = ["--store-dir", str(root / "dispatch"), "--storage", s_addr]
                with service(
                    "dispatch", [*dispatch_args, "--log-level", "warning"], root
                ) as d_addr:
                    pid = int(json.loads((root / "dispatch.ready").read_text())["pid"])
                    spy = spy_on(pid, args.spy) if args.spy and run == 0 else None
                    replay(
                        d_addr,
                        pid,
                        storage_pid,
                        end,
                        args.records,
                        threads=args.threads,
                        watch=args.watch,
                    )
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)
                        spy.wait(timeout=60)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def spy_on(pid: int, out: str) -> subprocess.Popen[bytes]:
    py_spy = Path(sys.executable).parent / "py-spy"
    cmd = [
        str(py_spy),
        "record",
        "-r",
        "1000",
        "--format",
        "raw",
        "--gil",
        "-o",
        out,
        "--pid",
        str(pid),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL)


def replay(
    dispatch_addr: str,
    pid: int,
    storage_pid: int,
    end: int,
    records: int,
    *,
    threads: bool,
    watch: bool = False,
) -> None:
    """From the dispatch's ready file (it has reconciled and follows) to caught up."""
    dispatch = dpb_grpc.DispatchStub(grpc.insecure_channel(dispatch_addr))
    threads_before = thread_cpu_s(pid)
    started, storage_before = time.monotonic(), cpu_s(storage_pid)
    user_before, system_before = user_system_s(pid)
    faults_before = minor_faults(pid)
    if watch:
        watch_until_caught_up(dispatch, records)
    else:
        poll_until_caught_up(dispatch, end)
    elapsed_s = time.monotonic() - started
    user_s, system_s = user_system_s(pid)
    user_s -= user_before
    system_s -= system_before
    used_s = user_s + system_s
    storage_s = cpu_s(storage_pid) - storage_before
    status = dispatch.GetStatus(dpb.GetDispatchStatusRequest(), timeout=60)
    assert status.dispatched_offset >= end, (status.dispatched_offset, end)
    print(
        f"replayed {records:,} records ({end:,} B) in {elapsed_s:.2f} s: "
        f"{records / elapsed_s:,.0f} records/s; dispatch CPU {used_s:.2f} s "
        f"(user {user_s:.2f}, system {system_s:.2f}; "
        f"{used_s / records * 1e6:.2f} us per record, "
        f"{minor_faults(pid) - faults_before:,} page faults), "
        f"storage CPU {storage_s:.2f} s; load {loadavg()}",
        flush=True,
    )
    if threads:
        after = thread_cpu_s(pid)
        used = {k: v - threads_before.get(k, 0.0) for k, v in after.items()}
        print(
            "  dispatch threads: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(used.items()) if v >= 0.01),
            flush=True,
        )


def watch_until_caught_up(dispatch: dpb_grpc.DispatchStub, records: int) -> None:
    """Until every queue of the topic holds its records, told by ``WatchArrivals`` (a
    few stream messages per applied batch: the dispatch's CPU is its own)."""
    wanted = {queue_id: len(range(queue_id, records, QUEUES)) for queue_id in range(QUEUES)}
    request = dpb.WatchArrivalsRequest(topics=[TOPIC], send_current=True)
    notices = dispatch.WatchArrivals(request, timeout=REPLAY_TIMEOUT_S)
    try:
        for notice in notices:
            if notice.max_offset >= wanted.get(notice.queue_id, 0):
                wanted.pop(notice.queue_id, None)
                if not wanted:
                    return
    finally:
        notices.cancel()  # type: ignore[no-untyped-call]
    raise RuntimeError("the arrivals stream ended before the replay did")


def poll_until_caught_up(dispatch: dpb_grpc.DispatchStub, end: int) -> None:
    """Until ``GetStatus`` says the dispatched offset reached ``end``, asking every 10 ms
    (each call also costs the dispatch a call to the storage)."""
    started = time.monotonic()
    while time.monotonic() - started < REPLAY_TIMEOUT_S:
        status = dispatch.GetStatus(dpb.GetDispatchStatusRequest(), timeout=60)
        if status.dispatched_offset >= end:
            return
        time.sleep(0.01)
    raise RuntimeError(f"dispatch did not finish the replay within {REPLAY_TIMEOUT_S} s")


if __name__ == "__main__":
    main()

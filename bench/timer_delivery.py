"""Timed messages at scale: 1,000,000 due over 10 minutes (real storage + dispatch).

    python -m bench.timer_delivery                 # 1,000,000 due over 600 s
    python -m bench.timer_delivery --quick         # 20,000 due over 20 s (a smoke run)
    python -m bench.timer_delivery --count 200000 --spread-s 120 --json

Starts a storage and a dispatch process (the timer runs in the dispatch) on a fresh
directory, then appends ``--count`` timed messages to the storage's timer topic as the
gateway's produce rewrite stores them (``REAL_TOPIC``, ``REAL_QID``, ``TIMER_DELIVER_MS``,
``TIMER_OUT_MS``, ``UNIQ_KEY``), due at random moments in ``[lead, lead + spread]`` after
the start, interleaved with normal messages of the same size (one normal batch per
``--normal-every`` timed batches) so that both rates come from the same run. It then waits
until every timed message was delivered and reports:

* the peak resident memory (VmHWM) of the storage and of the dispatch processes, and the
  largest RSS sampled every second;
* the delivery lateness (store time of the delivered copy minus its due time, the due
  time being carried in the first 8 bytes of the body): p50, p99, max;
* the append rate of timed and of normal messages (messages per second of Append call
  time) and their ratio;
* delivered, lost and duplicated messages (by UNIQ_KEY).

The messages go to the storage's Append (what the gateway's produce ends in), not through
a gateway: the produce-side rewrite is the gateway's part of issue 18 (not on this branch
when this was written); ``--count`` messages must be appended before the first is due
(``--lead-s``), or the early ones count as late by the time it took.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from tide.format import (
    REAL_QID,
    REAL_TOPIC,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
    TIMER_TOPIC,
    UNIQ_KEY,
    TimerWheelGeometry,
    timer_slot_time_ms,
)
from tide.spawn import running
from tide.v1 import dispatch_pb2 as dpb
from tide.v1 import dispatch_pb2_grpc as dpb_grpc
from tide.v1 import storage_pb2 as spb
from tide.v1 import storage_pb2_grpc as spb_grpc

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 120.0
RPC_TIMEOUT_S = 60.0
REAL_TOPIC_NAME = "T_bench_timed"
NORMAL_TOPIC_NAME = "T_bench_normal"
QUEUES = 4
READ_BATCH = 1000
_DUE = struct.Struct(">q")


@dataclass
class Report:
    count: int
    spread_s: float
    lead_s: float
    produce_s: float
    timed_rate: float
    normal_rate: float
    rate_ratio: float
    delivered: int
    lost: int
    duplicates: int
    lateness_min_ms: int  # < 0 would be a message delivered early
    lateness_p50_ms: int
    lateness_p99_ms: int
    lateness_max_ms: int
    storage_peak_rss_bytes: int
    dispatch_peak_rss_bytes: int
    storage_max_sampled_rss_bytes: int
    dispatch_max_sampled_rss_bytes: int
    storage_max_sampled_anon_bytes: int  # RssAnon: without the mapped files' pages
    dispatch_max_sampled_anon_bytes: int


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@contextmanager
def _service(name: str, args: list[str], run_dir: Path) -> Iterator[tuple[str, int]]:
    ready = run_dir / f"{name}.ready"
    cmd = [sys.executable, "-m", f"services.{name}", "--listen", "127.0.0.1:0", *args]
    with running(
        cmd,
        ready,
        name,
        READY_TIMEOUT_S,
        stderr_path=run_dir / f"{name}.stderr",
        stop_timeout_s=STOP_TIMEOUT_S,
    ) as process:
        yield process.listen, process.proc.pid


def _rss_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class _RssSampler:
    """The largest VmRSS and RssAnon (the process's own memory, without the mapped files'
    pages) of each process, sampled every second (bounded: two ints each)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.max_kib = dict.fromkeys(pids, 0)
        self.max_anon_kib = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for name, pid in self.pids.items():
                self.max_kib[name] = max(self.max_kib[name], _rss_kib(pid, "VmRSS"))
                anon = _rss_kib(pid, "RssAnon")
                self.max_anon_kib[name] = max(self.max_anon_kib[name], anon)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _timed(index: int, due_ms: int, body_bytes: int, geometry: TimerWheelGeometry) -> spb.Message:
    body = _DUE.pack(due_ms) + bytes(max(0, body_bytes - _DUE.size))
    properties = {
        REAL_TOPIC: REAL_TOPIC_NAME,
        REAL_QID: str(index % QUEUES),
        TIMER_DELIVER_MS: str(due_ms),
        TIMER_OUT_MS: str(timer_slot_time_ms(geometry, due_ms)),
        UNIQ_KEY: f"u{index:09d}",
    }
    return spb.Message(topic=TIMER_TOPIC, queue_id=0, body=body, properties=properties)


def _normal(index: int, body_bytes: int) -> spb.Message:
    return spb.Message(
        topic=NORMAL_TOPIC_NAME,
        queue_id=index % QUEUES,
        body=bytes(body_bytes),
        properties={UNIQ_KEY: f"n{index:09d}"},
    )


def _append(stub: spb_grpc.StorageStub, messages: list[spb.Message]) -> float:
    started = time.perf_counter()
    stub.Append(spb.AppendRequest(messages=messages), timeout=RPC_TIMEOUT_S)
    return time.perf_counter() - started


def _produce(
    stub: spb_grpc.StorageStub, args: argparse.Namespace, start_ms: int
) -> tuple[float, float, float]:
    """Append the timed and the normal messages; (seconds, timed rate, normal rate)."""
    rng = random.Random(args.seed)
    geometry = TimerWheelGeometry(args.timer_precision_ms)
    lead_ms, spread_ms = int(args.lead_s * 1000), int(args.spread_s * 1000)
    timed_s = normal_s = 0.0
    normal_sent = 0
    began = time.perf_counter()
    for batch_no, first in enumerate(range(0, args.count, args.batch)):
        batch = [
            _timed(i, start_ms + lead_ms + rng.randrange(spread_ms + 1), args.body_bytes, geometry)
            for i in range(first, min(args.count, first + args.batch))
        ]
        timed_s += _append(stub, batch)
        if batch_no % args.normal_every == 0:
            normal = [_normal(normal_sent + i, args.body_bytes) for i in range(args.batch)]
            normal_s += _append(stub, normal)
            normal_sent += len(normal)
    return (
        time.perf_counter() - began,
        args.count / timed_s if timed_s else 0.0,
        normal_sent / normal_s if normal_s else 0.0,
    )


def _wait_delivered(dispatch: dpb_grpc.DispatchStub, last_due_ms: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = dispatch.GetStatus(dpb.GetDispatchStatusRequest(), timeout=RPC_TIMEOUT_S)
        delivery = status.delivery
        if delivery.timer_pending == 0 and delivery.timer_delivered_to_ms > last_due_ms:
            return
        time.sleep(1.0)
    raise TimeoutError(f"timed messages still pending after {timeout_s:.0f} s")


def _delivered(
    dispatch: dpb_grpc.DispatchStub, storage: spb_grpc.StorageStub
) -> Iterator[spb.StoredMessage]:
    for queue_id in range(QUEUES):
        request = dpb.GetQueueOffsetsRequest(topic=REAL_TOPIC_NAME, queue_id=queue_id)
        try:
            offsets = dispatch.GetQueueOffsets(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError:
            continue
        offset = offsets.min_offset
        while offset < offsets.max_offset:
            entries = dispatch.GetQueueEntries(
                dpb.GetQueueEntriesRequest(
                    topic=REAL_TOPIC_NAME, queue_id=queue_id, offset=offset, max_count=READ_BATCH
                ),
                timeout=RPC_TIMEOUT_S,
            )
            if not entries.entries:
                break
            read = spb.ReadRequest(
                positions=[
                    spb.ReadRequest.Position(physical_offset=e.physical_offset, size=e.size)
                    for e in entries.entries
                ]
            )
            for result in storage.Read(read, timeout=RPC_TIMEOUT_S).results:
                if result.status == spb.FOUND:
                    yield result.message
            offset = entries.next_offset


def _percentile(ordered: list[int], fraction: float) -> int:
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0


def run(args: argparse.Namespace, root: Path) -> Report:
    store, dispatch_dir = root / "store", root / "dispatch"
    storage_args = ["--store-dir", str(store), "--log-level", "warning"]
    storage_args += ["--segment-size-bytes", str(256 << 20)]
    with _service("storage", storage_args, root) as (s_addr, s_pid):
        d_args = ["--store-dir", str(dispatch_dir), "--storage", s_addr, "--log-level", "warning"]
        d_args += ["--timer-precision-ms", str(args.timer_precision_ms)]
        with (
            _service("dispatch", d_args, root) as (d_addr, d_pid),
            grpc.insecure_channel(s_addr) as s_channel,
            grpc.insecure_channel(d_addr) as d_channel,
            _RssSampler({"storage": s_pid, "dispatch": d_pid}) as sampler,
        ):
            storage = spb_grpc.StorageStub(s_channel)
            dispatch = dpb_grpc.DispatchStub(d_channel)
            start_ms = _now_ms()
            produce_s, timed_rate, normal_rate = _produce(storage, args, start_ms)
            last_due = start_ms + int((args.lead_s + args.spread_s) * 1000)
            timeout_s = args.lead_s + args.spread_s + args.drain_timeout_s
            _wait_delivered(dispatch, last_due, timeout_s)
            peaks = {name: _rss_kib(pid, "VmHWM") * 1024 for name, pid in sampler.pids.items()}
            keys: Counter[str] = Counter()
            lateness: list[int] = []
            for message in _delivered(dispatch, storage):
                keys[message.properties.get(UNIQ_KEY, "")] += 1
                lateness.append(message.store_timestamp_ms - _DUE.unpack_from(message.body)[0])
    lateness.sort()
    return Report(
        count=args.count,
        spread_s=args.spread_s,
        lead_s=args.lead_s,
        produce_s=round(produce_s, 1),
        timed_rate=round(timed_rate),
        normal_rate=round(normal_rate),
        rate_ratio=round(timed_rate / normal_rate, 3) if normal_rate else 0.0,
        delivered=len(keys),
        lost=args.count - len(keys),
        duplicates=sum(keys.values()) - len(keys),
        lateness_min_ms=lateness[0] if lateness else 0,
        lateness_p50_ms=_percentile(lateness, 0.5),
        lateness_p99_ms=_percentile(lateness, 0.99),
        lateness_max_ms=lateness[-1] if lateness else 0,
        storage_peak_rss_bytes=peaks["storage"],
        dispatch_peak_rss_bytes=peaks["dispatch"],
        storage_max_sampled_rss_bytes=sampler.max_kib["storage"] * 1024,
        dispatch_max_sampled_rss_bytes=sampler.max_kib["dispatch"] * 1024,
        storage_max_sampled_anon_bytes=sampler.max_anon_kib["storage"] * 1024,
        dispatch_max_sampled_anon_bytes=sampler.max_anon_kib["dispatch"] * 1024,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="timed messages")
    parser.add_argument("--spread-s", type=float, default=600.0, help="due over, seconds")
    parser.add_argument("--lead-s", type=float, default=180.0, help="first due after, seconds")
    parser.add_argument("--batch", type=int, default=100, help="messages per Append")
    parser.add_argument("--normal-every", type=int, default=4, help="timed batches per normal")
    parser.add_argument("--body-bytes", type=int, default=128)
    parser.add_argument("--drain-timeout-s", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument(
        "--timer-precision-ms", type=int, choices=(100, 200, 500, 1000), default=1000
    )
    parser.add_argument("--quick", action="store_true", help="20,000 over 20 s, lead 10 s")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.count, args.spread_s, args.lead_s = 20_000, 20.0, 10.0
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tide-timer-"))
    try:
        report = run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(asdict(report), indent=2))
        return
    mib = 1 << 20
    print(f"{report.count} timed messages due over {report.spread_s:.0f} s")
    print(
        f"appended in {report.produce_s} s: timed {report.timed_rate} msg/s, "
        f"normal {report.normal_rate} msg/s, ratio {report.rate_ratio}"
    )
    print(f"delivered {report.delivered}, lost {report.lost}, duplicates {report.duplicates}")
    print(
        f"lateness p50 {report.lateness_p50_ms} ms, p99 {report.lateness_p99_ms} ms, "
        f"max {report.lateness_max_ms} ms"
    )
    print(
        f"peak RSS: storage {report.storage_peak_rss_bytes / mib:.0f} MiB, "
        f"dispatch {report.dispatch_peak_rss_bytes / mib:.0f} MiB"
    )


if __name__ == "__main__":
    main()

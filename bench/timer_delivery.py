"""Timed messages at scale: 1,000,000 due over 10 minutes, produced through a gateway.

    python -m bench.timer_delivery                 # 1,000,000 due over 600 s
    python -m bench.timer_delivery --quick         # 20,000 due over 20 s (a smoke run)
    python -m bench.timer_delivery --count 200000 --spread-s 120 --json
    python -m bench.timer_delivery --mode append   # straight to the storage's Append

Starts a cluster of real processes on a fresh directory as bench/gateway_produce_pull.py
does (a name server, a storage registered with it, its dispatch, where the timer runs, and
a gateway), creates a DELAY topic and a NORMAL topic of ``QUEUES`` queues each, then sends
``--count`` timed messages with the client's ``Producer`` (``deliver_at_ms``, batches of
``--batch``) to the DELAY topic, due at random moments in ``[lead, lead + spread]`` after
the start, interleaved with normal messages of the same size in batches of the same size
to the NORMAL topic (one normal batch per ``--normal-every`` timed batches), so that both
produce rates come from the same run. The gateway rewrites each timed message into the
timer topic (``rmq_sys_wheel_timer``), the dispatch's timer delivers it to the DELAY topic
when due. The bench then waits until every timed message was delivered and reports:

* the peak resident memory (VmHWM) of the storage and of the dispatch processes, and the
  largest RSS and RssAnon sampled every second;
* the delivery lateness (store time of the delivered copy minus the asked delivery time,
  carried in the first 8 bytes of the body): min, p50, p99, max;
* the produce rate of timed and of normal messages (messages per second of ``send_batch``
  call time) and their ratio;
* delivered, lost and duplicated messages (every delivered copy read back, counted by the
  message's number, carried in the body after the due time).

``--mode append`` keeps the first version of this benchmark: the messages are appended
straight to the storage's Append, the timed ones already rewritten as the gateway stores
them, so the rates compare what the storage alone does for a timed and a normal message.
``--count`` messages must be produced before the first is due (``--lead-s``), or the
early ones count as late by the time it took (``produce_overran_lead_s`` says by how much).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import grpc

from bench.gateway_produce_pull import PROCESSES, free_port, own_cpu_s, process_cpu_s, service
from tide.client import MAX_BATCH_MESSAGES, Admin, Message, Producer
from tide.format import (
    REAL_QID,
    REAL_TOPIC,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
    TIMER_PRECISIONS_MS,
    TIMER_TOPIC,
    UNIQ_KEY,
    TimerWheelGeometry,
    timer_slot_time_ms,
)
from tide.v1 import dispatch_pb2 as dpb
from tide.v1 import dispatch_pb2_grpc as dpb_grpc
from tide.v1 import storage_pb2 as spb
from tide.v1 import storage_pb2_grpc as spb_grpc

RPC_TIMEOUT_S = 60.0
REAL_TOPIC_NAME = "T_bench_timed"
NORMAL_TOPIC_NAME = "T_bench_normal"
BROKER = "broker-a"
QUEUES = 4
READ_BATCH = 1000
MODES = ("gateway", "append")
# A body starts with the asked delivery time (ms, 0 for a normal message) and the
# message's number: lateness and loss/duplicates need nothing else.
_STAMP = struct.Struct(">qq")


@dataclass
class Report:
    mode: str
    started_utc: str
    count: int
    spread_s: float
    lead_s: float
    timer_precision_ms: int
    produce_s: float
    produce_overran_lead_s: float  # > 0: the first ones were due before all were produced
    timed_rate: float
    normal_rate: float
    rate_ratio: float
    # CPU of each process while producing, per message produced (timed and normal: their
    # calls interleave), and from then until every timed message was delivered.
    produce_cpu_us_per_message: dict[str, float]
    delivery_cpu_s: dict[str, float]
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
    loadavg_before: list[float]
    loadavg_after: list[float]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _loadavg() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


@dataclass(frozen=True)
class _Cluster:
    storage: str
    dispatch: str
    gateway: str
    pids: dict[str, int]  # storage and dispatch: their memory is sampled

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) so far of every service and of this client."""
        seconds = {name: process_cpu_s(proc.pid) for name, proc in PROCESSES.items()}
        return {**seconds, "client": own_cpu_s()}


@contextmanager
def _cluster(args: argparse.Namespace, root: Path) -> Iterator[_Cluster]:
    """A name server, a registered storage, its dispatch (separate store dir, where the
    timer keeps its files) and a gateway, started as bench/gateway_produce_pull.py does."""
    with ExitStack() as stack:
        namesrv = stack.enter_context(service("nameserver", ["--listen", "127.0.0.1:0"], root))
        storage, dispatch = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        storage_args = ["--listen", storage, "--store-dir", str(root / "store")]
        storage_args += ["--namesrv", namesrv, "--broker-name", BROKER]
        storage_args += ["--dispatch-address", dispatch, "--segment-size-bytes", str(256 << 20)]
        stack.enter_context(service("storage", storage_args, root))
        dispatch_args = ["--listen", dispatch, "--store-dir", str(root / "dispatch")]
        dispatch_args += ["--storage", storage]
        if args.timer_precision_ms is not None:  # else the dispatch's default
            dispatch_args += ["--timer-precision-ms", str(args.timer_precision_ms)]
        stack.enter_context(service("dispatch", dispatch_args, root))
        gateway_args = ["--listen", "127.0.0.1:0", "--namesrv", namesrv]
        gateway = stack.enter_context(service("gateway", gateway_args, root))
        pids = {name: PROCESSES[name].pid for name in ("storage", "dispatch")}
        yield _Cluster(storage, dispatch, gateway, pids)


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

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _body(due_ms: int, number: int, body_bytes: int) -> bytes:
    return _STAMP.pack(due_ms, number) + bytes(max(0, body_bytes - _STAMP.size))


class _Sender(Protocol):
    """Sends one batch; returns the seconds the call took (what the rates are of)."""

    def timed(self, batch: list[tuple[int, int]]) -> float: ...  # (number, due ms)

    def normal(self, first: int, count: int) -> float: ...


class _GatewaySender:
    """Through the gateway with the client's Producer: the timed messages with
    ``deliver_at_ms`` (the gateway rewrites them), each batch to the topic's next queue."""

    def __init__(self, producer: Producer, body_bytes: int) -> None:
        self.producer, self.body_bytes = producer, body_bytes

    def _send(self, messages: list[Message]) -> float:
        started = time.perf_counter()
        results = self.producer.send_batch(messages)
        elapsed = time.perf_counter() - started
        failed = [r.error for r in results if not r.written]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(results)} not written: {failed[0]}")
        return elapsed

    def timed(self, batch: list[tuple[int, int]]) -> float:
        return self._send(
            [
                Message(REAL_TOPIC_NAME, _body(due, number, self.body_bytes), deliver_at_ms=due)
                for number, due in batch
            ]
        )

    def normal(self, first: int, count: int) -> float:
        return self._send(
            [Message(NORMAL_TOPIC_NAME, _body(0, first + i, self.body_bytes)) for i in range(count)]
        )


class _AppendSender:
    """Straight to the storage's Append, the timed messages stored as the gateway's
    rewrite stores them (``REAL_TOPIC``, ``REAL_QID``, ``TIMER_*``, ``UNIQ_KEY``)."""

    def __init__(self, stub: spb_grpc.StorageStub, body_bytes: int, precision_ms: int) -> None:
        self.stub, self.body_bytes = stub, body_bytes
        self.geometry = TimerWheelGeometry(precision_ms)

    def _append(self, messages: list[spb.Message]) -> float:
        started = time.perf_counter()
        self.stub.Append(spb.AppendRequest(messages=messages), timeout=RPC_TIMEOUT_S)
        return time.perf_counter() - started

    def timed(self, batch: list[tuple[int, int]]) -> float:
        messages = []
        for number, due in batch:
            properties = {
                REAL_TOPIC: REAL_TOPIC_NAME,
                REAL_QID: str(number % QUEUES),
                TIMER_DELIVER_MS: str(due),
                TIMER_OUT_MS: str(timer_slot_time_ms(self.geometry, due)),
                UNIQ_KEY: f"u{number:09d}",
            }
            body = _body(due, number, self.body_bytes)
            messages.append(spb.Message(topic=TIMER_TOPIC, body=body, properties=properties))
        return self._append(messages)

    def normal(self, first: int, count: int) -> float:
        messages = [
            spb.Message(
                topic=NORMAL_TOPIC_NAME,
                queue_id=(first + i) % QUEUES,
                body=_body(0, first + i, self.body_bytes),
                properties={UNIQ_KEY: f"n{first + i:09d}"},
            )
            for i in range(count)
        ]
        return self._append(messages)


@dataclass(frozen=True)
class _Produced:
    seconds: float
    messages: int  # timed and normal
    timed_rate: float
    normal_rate: float


def _produce(sender: _Sender, args: argparse.Namespace, start_ms: int) -> _Produced:
    """Send the timed and the normal messages, interleaved."""
    rng = random.Random(args.seed)
    lead_ms, spread_ms = int(args.lead_s * 1000), int(args.spread_s * 1000)
    timed_s = normal_s = 0.0
    normal_sent = 0
    began = time.perf_counter()
    for batch_no, first in enumerate(range(0, args.count, args.batch)):
        numbers = range(first, min(args.count, first + args.batch))
        timed_s += sender.timed(
            [(i, start_ms + lead_ms + rng.randrange(spread_ms + 1)) for i in numbers]
        )
        if batch_no % args.normal_every == 0:
            normal_s += sender.normal(normal_sent, args.batch)
            normal_sent += args.batch
    return _Produced(
        time.perf_counter() - began,
        args.count + normal_sent,
        args.count / timed_s if timed_s else 0.0,
        normal_sent / normal_s if normal_s else 0.0,
    )


def _wait_delivered(dispatch: dpb_grpc.DispatchStub, last_due_ms: int, timeout_s: float) -> None:
    """Until the timer is past the last due time with nothing pending, and the dispatch
    has dispatched what the storage held then (the last copies are in their queues)."""
    deadline = time.monotonic() + timeout_s
    delivered_at: int | None = None  # the storage's max offset once all were delivered
    while time.monotonic() < deadline:
        status = dispatch.GetStatus(dpb.GetDispatchStatusRequest(), timeout=RPC_TIMEOUT_S)
        delivery = status.delivery
        if delivered_at is None and (
            delivery.timer_pending == 0 and delivery.timer_delivered_to_ms > last_due_ms
        ):
            delivered_at = status.storage_max_offset
        if delivered_at is not None and status.dispatched_offset >= delivered_at:
            return
        time.sleep(1.0)  # a poll of the dispatch's status, bounded by the deadline
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


def _sender(
    stack: ExitStack, args: argparse.Namespace, cluster: _Cluster, precision_ms: int
) -> _Sender:
    if args.mode == "append":
        channel = stack.enter_context(grpc.insecure_channel(cluster.storage))
        stub = spb_grpc.StorageStub(channel)
        return _AppendSender(stub, args.body_bytes, precision_ms)
    with Admin(cluster.gateway) as admin:  # waits until the route shows the topic
        admin.create_topic(REAL_TOPIC_NAME, read_queue_nums=QUEUES, message_type="DELAY")
        admin.create_topic(NORMAL_TOPIC_NAME, read_queue_nums=QUEUES)
    producer = stack.enter_context(Producer(cluster.gateway))
    return _GatewaySender(producer, args.body_bytes)


@dataclass
class _ReadBack:
    copies: Counter[int]
    lateness_ms: list[int]


def _read_back(dispatch: dpb_grpc.DispatchStub, storage: spb_grpc.StorageStub) -> _ReadBack:
    """Every delivered copy: how many of each message number, and each copy's lateness."""
    copies: Counter[int] = Counter()
    lateness_ms: list[int] = []
    for message in _delivered(dispatch, storage):
        due_ms, number = _STAMP.unpack_from(message.body)
        copies[number] += 1
        lateness_ms.append(message.store_timestamp_ms - due_ms)
    lateness_ms.sort()
    return _ReadBack(copies, lateness_ms)


def run(args: argparse.Namespace, root: Path) -> Report:
    started_utc = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    loadavg_before = _loadavg()
    with ExitStack() as stack:
        cluster = stack.enter_context(_cluster(args, root))
        sampler = stack.enter_context(_RssSampler(cluster.pids))
        storage = spb_grpc.StorageStub(stack.enter_context(grpc.insecure_channel(cluster.storage)))
        dispatch = dpb_grpc.DispatchStub(
            stack.enter_context(grpc.insecure_channel(cluster.dispatch))
        )
        status = dispatch.GetStatus(dpb.GetDispatchStatusRequest(), timeout=RPC_TIMEOUT_S)
        precision_ms = status.delivery.timer_precision_ms  # what the timer runs with
        sender = _sender(stack, args, cluster, precision_ms)
        cpu_before = cluster.cpu_s()
        start_ms = _now_ms()
        produced = _produce(sender, args, start_ms)
        overran_s = max(0.0, (_now_ms() - start_ms) / 1000 - args.lead_s)
        cpu_produced = cluster.cpu_s()
        last_due = start_ms + int((args.lead_s + args.spread_s) * 1000)
        timeout_s = args.lead_s + args.spread_s + args.drain_timeout_s
        _wait_delivered(dispatch, last_due, timeout_s)
        cpu_delivered = cluster.cpu_s()
        # Sampling stops first: each peak (VmHWM) then bounds every sample, which a sample
        # taken during the read-back below (it grows the dispatch) would not be.
        sampler.stop()
        peaks = {name: _rss_kib(pid, "VmHWM") * 1024 for name, pid in cluster.pids.items()}
        read = _read_back(dispatch, storage)
    lateness, copies = read.lateness_ms, read.copies
    return Report(
        mode=args.mode,
        started_utc=started_utc,
        count=args.count,
        spread_s=args.spread_s,
        lead_s=args.lead_s,
        timer_precision_ms=precision_ms,
        produce_s=round(produced.seconds, 1),
        produce_overran_lead_s=round(overran_s, 1),
        timed_rate=round(produced.timed_rate),
        normal_rate=round(produced.normal_rate),
        rate_ratio=(
            round(produced.timed_rate / produced.normal_rate, 3) if produced.normal_rate else 0.0
        ),
        produce_cpu_us_per_message={
            name: round((cpu_produced[name] - cpu_before[name]) / produced.messages * 1e6, 1)
            for name in cpu_before
        },
        delivery_cpu_s={
            name: round(cpu_delivered[name] - cpu_produced[name], 1) for name in cpu_before
        },
        delivered=len(copies),
        lost=args.count - len(copies),
        duplicates=sum(copies.values()) - len(copies),
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
        loadavg_before=loadavg_before,
        loadavg_after=_loadavg(),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, default="gateway", help="how to produce")
    parser.add_argument("--count", type=int, default=1_000_000, help="timed messages")
    parser.add_argument("--spread-s", type=float, default=600.0, help="due over, seconds")
    parser.add_argument("--lead-s", type=float, default=240.0, help="first due after, seconds")
    parser.add_argument("--batch", type=int, default=100, help="messages per batch (both kinds)")
    parser.add_argument("--normal-every", type=int, default=4, help="timed batches per normal")
    parser.add_argument("--body-bytes", type=int, default=128)
    parser.add_argument("--drain-timeout-s", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument(
        "--timer-precision-ms",
        type=int,
        choices=TIMER_PRECISIONS_MS,
        help="the dispatch's (default: its default)",
    )
    parser.add_argument("--quick", action="store_true", help="20,000 over 20 s, lead 10 s")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.count, args.spread_s, args.lead_s = 20_000, 20.0, 10.0
    if not 1 <= args.batch <= MAX_BATCH_MESSAGES:
        parser.error(f"--batch is {args.batch}; give 1..{MAX_BATCH_MESSAGES}")
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
    print(f"{report.count} timed messages due over {report.spread_s:.0f} s ({report.mode} mode)")
    print(
        f"produced in {report.produce_s} s: timed {report.timed_rate} msg/s, "
        f"normal {report.normal_rate} msg/s, ratio {report.rate_ratio}"
    )
    cpu = ", ".join(f"{k} {v}" for k, v in report.produce_cpu_us_per_message.items())
    print(f"CPU while producing, us a message: {cpu}")
    cpu = ", ".join(f"{k} {v}" for k, v in report.delivery_cpu_s.items())
    print(f"CPU from then until delivered, s: {cpu}")
    if report.produce_overran_lead_s:
        print(f"produce overran the lead by {report.produce_overran_lead_s} s: raise --lead-s")
    print(f"delivered {report.delivered}, lost {report.lost}, duplicates {report.duplicates}")
    print(
        f"lateness min {report.lateness_min_ms} ms, p50 {report.lateness_p50_ms} ms, "
        f"p99 {report.lateness_p99_ms} ms, max {report.lateness_max_ms} ms"
    )
    print(
        f"peak RSS: storage {report.storage_peak_rss_bytes / mib:.0f} MiB, "
        f"dispatch {report.dispatch_peak_rss_bytes / mib:.0f} MiB; largest RssAnon: "
        f"storage {report.storage_max_sampled_anon_bytes / mib:.0f} MiB, "
        f"dispatch {report.dispatch_max_sampled_anon_bytes / mib:.0f} MiB"
    )


if __name__ == "__main__":
    main()

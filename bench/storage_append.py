"""Storage append benchmark: throughput and latency, in-process and over gRPC.

    python -m bench.storage_append                       # the whole matrix (~3 min)
    python -m bench.storage_append --only inproc --sizes 128 --batches 100

Cases (each for every message size, batch size and flush mode asked for):

* ``inproc-store``: ``MessageStore.put`` with ready ``MessageInput`` objects: validation,
  encoding and the append, on one thread (SYNC: ``--sync-callers`` threads, each waiting
  for its group commit).
* ``inproc-run``: ``MessageStore.put_run`` of a record run encoded beforehand (what the
  gateway sends): the store's checks of the run and the append.
* ``inproc-commitlog``: ``CommitLog.append`` of records encoded beforehand: the part under
  the append lock alone.
* ``grpc``: a real storage process; an asyncio client with ``--inflight`` calls in
  flight (SYNC: ``--sync-callers``), the same request object sent again and again.

Each case starts on a fresh store, makes one call, then waits ``--settle-s`` so the
allocator has prepared (and warmed) the next segment: the steady state of a running
broker, where a segment is ready long before it is needed. Latency is per call (one
batch). Results go to stdout as a Markdown table and to
``bench/results/storage_append.json``.
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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from services.storage.engine.config import GIB, FlushMode, StoreConfig
from services.storage.engine.message_codec import MessageInput, encode_message_properties
from services.storage.engine.message_store import MessageStore
from services.storage.engine.record_run import run_from_records
from tide.format import RunWriter, pack_host, parse_host
from tide.spawn import running
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

RESULTS = Path(__file__).resolve().parent / "results" / "storage_append.json"
READY_TIMEOUT_S = 60.0
MAX_CALLS_PER_CASE = 10_000_000


@dataclass
class Result:
    case: str
    flush: str
    size_bytes: int
    batch: int
    callers: int
    msgs_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    calls: int


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


def summarize(
    case: str, flush: str, size: int, batch: int, callers: int, lat_s: list[float], wall_s: float
) -> Result:
    lat_s.sort()
    msgs = len(lat_s) * batch
    return Result(
        case,
        flush,
        size,
        batch,
        callers,
        msgs_per_s=msgs / wall_s,
        mb_per_s=msgs * size / wall_s / 1e6,
        p50_ms=percentile(lat_s, 0.50) * 1e3,
        p99_ms=percentile(lat_s, 0.99) * 1e3,
        calls=len(lat_s),
    )


def messages(size: int, batch: int, queues: int = 8) -> list[MessageInput]:
    body = os.urandom(size)
    return [MessageInput("BenchTopic", i % queues, body, tags="TagA") for i in range(batch)]


def encoded_run(batch: list[MessageInput]) -> bytes:
    """The batch as a producer-encoded record run (what the gateway sends)."""
    writer = RunWriter(pack_host(parse_host("127.0.0.1:40000")))
    for message in batch:
        properties = encode_message_properties(message.tags, message.keys, message.properties)
        topic = message.topic
        writer.add(topic, topic.encode(), message.queue_id, message.body, properties, 0, 0, 1)
    return writer.getvalue()


@contextmanager
def open_store(root: Path, flush: str) -> Iterator[MessageStore]:
    shutil.rmtree(root, ignore_errors=True)
    store = MessageStore(
        StoreConfig(store_dir=root, segment_size_bytes=GIB, flush_mode=FlushMode(flush))
    )
    store.open()
    store.topics.ensure("BenchTopic", 8)
    try:
        yield store
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)


def run_threads(
    callers: int, duration_s: float, call: Callable[[], object]
) -> tuple[list[float], float]:
    """``callers`` threads calling ``call`` for ``duration_s``; per-call latencies."""
    latencies: list[list[float]] = [[] for _ in range(callers)]
    deadline = time.perf_counter() + duration_s

    def worker(out: list[float]) -> None:
        while time.perf_counter() < deadline and len(out) < MAX_CALLS_PER_CASE:
            start = time.perf_counter()
            call()
            out.append(time.perf_counter() - start)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(out,)) for out in latencies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [x for out in latencies for x in out], time.perf_counter() - start


def bench_inproc(
    root: Path, flush: str, size: int, batch: int, args: argparse.Namespace
) -> list[Result]:
    results = []
    callers = args.sync_callers if flush == "sync" else 1
    batch_msgs = messages(size, batch)
    with open_store(root, flush) as store:
        timeout_s = store.config.sync_flush_timeout_ms / 1000

        def put() -> None:
            durable = store.put(batch_msgs).durable
            if durable is not None:
                durable.result(timeout_s)

        put()  # warm-up: first segment, caches
        time.sleep(args.settle_s)  # steady state: the next segment is prepared
        lat, wall = run_threads(callers, args.duration_s, put)
        results.append(summarize("inproc-store", flush, size, batch, callers, lat, wall))
        run_bytes = encoded_run(batch_msgs)

        def put_run() -> None:
            durable = store.put_run([run_bytes]).durable
            if durable is not None:
                durable.result(timeout_s)

        lat, wall = run_threads(callers, args.duration_s, put_run)
        results.append(summarize("inproc-run", flush, size, batch, callers, lat, wall))
        if flush == "async":
            run = run_from_records(store.encode(batch_msgs))  # patched in place on each append
            lat, wall = run_threads(1, args.duration_s, lambda: store.commitlog.append(run))
            results.append(summarize("inproc-commitlog", flush, size, batch, 1, lat, wall))
    return results


@contextmanager
def storage_process(root: Path, flush: str | None) -> Iterator[str]:
    """A storage service on a fresh store; ``flush=None``: the bare echo instead."""
    shutil.rmtree(root, ignore_errors=True)
    ready = root.with_suffix(".ready")
    ready.unlink(missing_ok=True)
    if flush is None:
        cmd = [sys.executable, "-m", "bench.echo_server", str(ready)]
    else:
        cmd = [
            sys.executable,
            "-m",
            "services.storage",
            "--store-dir",
            str(root),
            "--listen",
            "127.0.0.1:0",
            "--flush",
            flush,
            "--log-level",
            "warning",
        ]
    try:
        with running(cmd, ready, "storage", READY_TIMEOUT_S, stop_timeout_s=60.0) as process:
            yield process.listen
    finally:
        shutil.rmtree(root, ignore_errors=True)
        ready.unlink(missing_ok=True)


async def grpc_clients(
    address: str, request: pb.AppendRequest, callers: int, duration_s: float, settle_s: float
) -> tuple[list[float], float]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.StorageStub(channel)
        await stub.Append(request)  # warm-up: first segment, caches
        await asyncio.sleep(settle_s)  # steady state: the next segment is prepared
        latencies: list[float] = []
        deadline = time.perf_counter() + duration_s

        async def worker() -> None:
            while time.perf_counter() < deadline and len(latencies) < MAX_CALLS_PER_CASE:
                start = time.perf_counter()
                await stub.Append(request)
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(callers)))
        return latencies, time.perf_counter() - start


def bench_grpc(
    root: Path, flush: str, size: int, batch: int, args: argparse.Namespace
) -> list[Result]:
    results = []
    if flush == "async":  # the baseline, once per shape
        results += _grpc_case("grpc-echo", root, None, size, batch, args.inflight, args)
    callers = args.sync_callers if flush == "sync" else args.inflight
    return [*results, *_grpc_case("grpc", root, flush, size, batch, callers, args)]


def _grpc_case(
    case: str,
    root: Path,
    flush: str | None,
    size: int,
    batch: int,
    callers: int,
    args: argparse.Namespace,
) -> list[Result]:
    body = os.urandom(size)
    request = pb.AppendRequest(
        messages=[
            pb.Message(topic="BenchTopic", queue_id=i % 4, body=body, tags="TagA")
            for i in range(batch)
        ]
    )
    with storage_process(root, flush) as address:
        lat, wall = asyncio.run(
            grpc_clients(address, request, callers, args.duration_s, args.settle_s)
        )
    return [summarize(case, flush or "-", size, batch, callers, lat, wall)]


def table(results: list[Result]) -> str:
    lines = [
        "| case | flush | size B | batch | callers | msgs/s | MB/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.case} | {r.flush} | {r.size_bytes} | {r.batch} | {r.callers} | "
            f"{r.msgs_per_s:,.0f} | {r.mb_per_s:.1f} | {r.p50_ms:.3f} | {r.p99_ms:.3f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("inproc", "grpc"), help="run one family of cases")
    parser.add_argument("--sizes", default="128,1024", help="message body sizes, bytes")
    parser.add_argument("--batches", default="1,32,100", help="messages per call")
    parser.add_argument("--flush", default="async,sync", help="flush modes")
    parser.add_argument("--duration-s", type=float, default=3.0, help="per case, seconds")
    parser.add_argument("--inflight", type=int, default=1, help="gRPC calls in flight (async)")
    parser.add_argument("--sync-callers", type=int, default=16, help="concurrent SYNC callers")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=4.0,
        help="pause after the first call so the next segment is prepared (steady state)",
    )
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="tide-bench-"))
    results: list[Result] = []
    for flush in args.flush.split(","):
        for size in map(int, args.sizes.split(",")):
            for batch in map(int, args.batches.split(",")):
                if args.only in (None, "inproc"):
                    results += bench_inproc(scratch / "store", flush, size, batch, args)
                if args.only in (None, "grpc"):
                    results += bench_grpc(scratch / "grpc-store", flush, size, batch, args)
                print(table(results).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    RESULTS.write_text(
        json.dumps({"machine": machine, "results": [asdict(r) for r in results]}, indent=1)
    )


if __name__ == "__main__":
    main()

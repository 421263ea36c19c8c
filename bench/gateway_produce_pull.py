"""Gateway benchmark: produce, pull and end-to-end latency through ``tide.v1.Gateway``.

    python -m bench.gateway_produce_pull                      # ~40 s
    python -m bench.gateway_produce_pull --duration-s 5 --inflight 4
    python -m bench.gateway_produce_pull --phases produce --producers 2 --inflight 4
    python -m bench.gateway_produce_pull --phases produce --produce-api stream --inflight 16
    python -m bench.gateway_produce_pull --py-spy /tmp/prof --py-spy-phase produce
    python -m bench.gateway_produce_pull --phases produce --metrics both --rounds 3

Starts real processes on a fresh store: a name server, one broker (storage + dispatch,
registered) and a gateway, and creates a topic with ``--queues`` queues. Then:

* ``produce``: 128-byte messages in batches of 100 (round robin), ``--inflight`` calls
  in flight, for ``--duration-s``: messages/s, and p50/p99 of a call's latency. With
  ``--produce-api stream`` the batches go over one ``ProduceStream`` per producer
  process instead, ``--inflight`` requests in flight on it (the gateway processes up to
  32 of a stream at once); a request's latency is from its write to its answer;
* ``pull``: every message read back (one puller per queue, ``--pull-batch`` messages a
  call, no long polling): messages/s;
* ``e2e``: a steady ``--rate`` messages/s (batches of 100) while one long-polling
  consumer per queue follows: p50/p99 from the send of a message's batch to its
  consumer receiving it.

For every phase the CPU time of each process (``/proc/PID/stat`` utime + stime, the
client's own ``getrusage``) is reported as microseconds per message and as a share of
one core: on a shared box it tells where the cores went. ``--py-spy DIR`` records each
service with py-spy (collapsed stacks, ``DIR/<service>.txt``) during one phase.

The client sends pre-serialized requests (the produce batch is encoded once), so its
own CPU is mostly gRPC's per-call (or per-message, on a stream) cost.

``--metrics on`` starts every service with ``--metrics-listen 127.0.0.1:0`` (Prometheus
endpoint on) and scrapes each endpoint every ``--scrape-interval-s`` (15 s, Prometheus's
default; 0: never) from a thread of the client; ``off`` (the default) passes no
``--metrics-listen``. ``--metrics both`` runs the whole benchmark ``--rounds`` times
each way, in ABBA order (off on, on off, ...) on a fresh cluster every time, and
reports the difference of the medians (messages/s and CPU per message): the cost of
metrics on the produce path. ``/proc/loadavg`` is recorded before and after every run.

Results go to stdout and ``bench/results/gateway_produce_pull.json``
(``gateway_metrics_overhead.json`` for ``--metrics both``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeAlias

import grpc

from tide.bench._load import body_stamps
from tide.spawn import running
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc

RESULTS = Path(__file__).resolve().parent / "results" / "gateway_produce_pull.json"
OVERHEAD_RESULTS = RESULTS.with_name("gateway_metrics_overhead.json")
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
TOPIC = "BenchGateway"
BROKER = "broker-a"
BATCH = 100
BODY_BYTES = 128
STAMP_DIGITS = 20  # a body starts with its send time, ns, in decimal
Encoding: TypeAlias = pb.PullRequest.Encoding.ValueType
ENCODINGS: dict[str, Encoding] = {
    "records": pb.PullRequest.ENCODING_RECORDS,
    "messages": pb.PullRequest.ENCODING_MESSAGES,
}
MAX_MESSAGES_PER_PHASE = 50_000_000
PHASES = ("produce", "pull", "e2e")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PRODUCE_METHOD = "/tide.v1.Gateway/Produce"
PRODUCE_STREAM_METHOD = "/tide.v1.Gateway/ProduceStream"
PRODUCE_APIS = ("unary", "stream")
# The services started by ``service``, by name (for CPU accounting and py-spy).
PROCESSES: dict[str, subprocess.Popen[bytes]] = {}
# Their Prometheus endpoints (HOST:PORT) when started with metrics on.
METRICS_ENDPOINTS: dict[str, str] = {}
METRICS_MODES = ("off", "on", "both")
MAX_ROUNDS = 10
SCRAPE_TIMEOUT_S = 5.0
MAX_SCRAPE_BYTES = 16 << 20
RECORD_COST_SAMPLES = 100_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def service(
    name: str, args: list[str], run_dir: Path, metrics: bool = False, profile: Path | None = None
) -> Iterator[str]:
    """``profile``: run the service under cProfile, its stats written to
    ``profile/<name>.prof`` when it stops."""
    ready = run_dir / f"{name}.ready"
    runner = ["-m", "cProfile", "-o", str(profile / f"{name}.prof")] if profile else []
    cmd = [sys.executable, *runner, "-m", f"services.{name}", *args, "--log-level", "warning"]
    if metrics:
        cmd += ["--metrics-listen", "127.0.0.1:0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    with running(
        cmd,
        ready,
        name,
        READY_TIMEOUT_S,
        stderr_path=run_dir / f"{name}.log",
        env=env,
        stop_timeout_s=STOP_TIMEOUT_S,
    ) as process:
        PROCESSES[name] = process.proc
        if metrics:
            METRICS_ENDPOINTS[name] = str(process.info["metrics"])
        try:
            yield process.listen
        finally:
            PROCESSES.pop(name, None)
            METRICS_ENDPOINTS.pop(name, None)


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # producer workers, once joined
    return usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime


def cpu_snapshot() -> dict[str, float]:
    snapshot = {name: process_cpu_s(proc.pid) for name, proc in PROCESSES.items()}
    snapshot["client"] = own_cpu_s()
    return snapshot


def cpu_report(
    before: dict[str, float], after: dict[str, float], wall_s: float, messages: int
) -> dict[str, dict[str, float]]:
    """Per process: CPU seconds, share of one core, microseconds per message."""
    return {
        name: {
            "cpu_s": round(after[name] - before[name], 3),
            "core_share": round((after[name] - before[name]) / wall_s, 3),
            "us_per_msg": round((after[name] - before[name]) / max(messages, 1) * 1e6, 2),
        }
        for name in after
        if name in before
    }


def settle(max_wait_s: float = 30.0) -> None:
    """Wait until every service is idle (below 5 % of a core over 0.5 s): the storage
    warms its next 1 GiB segment after start, which would count against the first
    phase."""
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        before = cpu_snapshot()
        time.sleep(0.5)
        after = cpu_snapshot()
        if all(after[name] - before[name] < 0.025 for name in PROCESSES):
            return


@contextmanager
def py_spy(directory: Path | None) -> Iterator[None]:
    """py-spy record of every service (collapsed stacks) while the block runs."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("py-spy")
    recorders = [
        subprocess.Popen(
            [
                str(exe),
                "record",
                "--pid",
                str(proc.pid),
                "--rate",
                "250",
                "--format",
                "raw",
                # --native (stacks into C) must pause the process at each sample
                *(["--native"] if os.environ.get("BENCH_PY_SPY_NATIVE") else ["--nonblocking"]),
                "--output",
                str(directory / f"{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, proc in PROCESSES.items()
        if name != "nameserver"
    ]
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        for recorder in recorders:
            recorder.send_signal(signal.SIGINT)
        for recorder in recorders:
            recorder.wait(timeout=60)


@contextmanager
def scraper(interval_s: float) -> Iterator[dict[str, int]]:
    """Scrape every metrics endpoint at once and then every ``interval_s`` from a thread
    (as Prometheus would); counts scrapes, bytes and errors."""
    stats = {"scrapes": 0, "bytes": 0, "errors": 0}
    if interval_s <= 0 or not METRICS_ENDPOINTS:
        yield stats
        return
    stop = threading.Event()

    def scrape_all() -> None:
        for endpoint in list(METRICS_ENDPOINTS.values()):
            url = f"http://{endpoint}/metrics"
            try:
                with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as answer:
                    stats["bytes"] += len(answer.read(MAX_SCRAPE_BYTES))
                stats["scrapes"] += 1
            except OSError:
                stats["errors"] += 1

    def loop() -> None:
        scrape_all()
        while not stop.wait(interval_s):
            scrape_all()

    thread = threading.Thread(target=loop, name="scraper", daemon=True)
    thread.start()
    try:
        yield stats
    finally:
        stop.set()
        thread.join(timeout=4 * SCRAPE_TIMEOUT_S)


def loadavg() -> list[float]:
    return [float(part) for part in Path("/proc/loadavg").read_text().split()[:3]]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def batch_request(body: bytes) -> pb.ProduceRequest:
    return pb.ProduceRequest(messages=[pb.ProduceMessage(topic=TOPIC, body=body)] * BATCH)


def produce_callable(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:  # type: ignore[type-arg]
    """Produce taking an already serialized request (bytes)."""
    return channel.unary_unary(
        PRODUCE_METHOD,
        request_serializer=None,
        response_deserializer=pb.ProduceResponse.FromString,
    )


async def produce_calls(
    gateway: str, inflight: int, duration_s: float, api: str = "unary"
) -> tuple[list[float], float]:
    """Latencies of the produce calls made by ``inflight`` callers for ``duration_s``
    (``api`` "stream": requests on one ProduceStream, ``inflight`` of them in flight)."""
    request = batch_request(b"p" * BODY_BYTES).SerializeToString()
    if api == "stream":
        return await produce_stream_calls(gateway, request, inflight, duration_s)
    latencies_s: list[float] = []
    async with grpc.aio.insecure_channel(gateway) as channel:
        produce = produce_callable(channel)
        start = time.monotonic()

        async def caller() -> None:
            while (
                time.monotonic() - start < duration_s
                and len(latencies_s) * BATCH < MAX_MESSAGES_PER_PHASE
            ):
                sent = time.monotonic()
                reply = await produce(request, timeout=30)
                latencies_s.append(time.monotonic() - sent)
                check_results(reply)

        await asyncio.gather(*(caller() for _ in range(inflight)))
        return latencies_s, time.monotonic() - start


def check_results(reply: pb.ProduceResponse) -> None:
    if any(result.status for result in reply.results):  # SEND_OK is 0
        raise AssertionError(f"not SEND_OK: {reply.results}")


async def produce_stream_calls(
    gateway: str, request: bytes, inflight: int, duration_s: float
) -> tuple[list[float], float]:
    """The serialized ``request`` written on one ProduceStream, ``inflight`` unanswered at
    most, for ``duration_s``; then half-close and read the last answers."""
    latencies_s: list[float] = []
    sent: collections.deque[float] = collections.deque()
    slots = asyncio.Semaphore(inflight)
    async with grpc.aio.insecure_channel(gateway) as channel:
        call = channel.stream_stream(
            PRODUCE_STREAM_METHOD,
            request_serializer=None,
            response_deserializer=pb.ProduceStreamResponse.FromString,
        )(timeout=duration_s + 60)  # type: ignore[call-arg]  # no iterator: call.write()
        start = time.monotonic()

        async def writer() -> None:
            while (
                time.monotonic() - start < duration_s
                and (len(latencies_s) + len(sent)) * BATCH < MAX_MESSAGES_PER_PHASE
            ):
                await slots.acquire()
                sent.append(time.monotonic())
                await call.write(request)
            await call.done_writing()

        async def reader() -> None:
            async for answer in call:
                latencies_s.append(time.monotonic() - sent.popleft())
                slots.release()
                if answer.error_code:
                    raise AssertionError(f"error {answer.error_code}: {answer.error_message}")
                check_results(answer.response)

        await asyncio.gather(writer(), reader())
        return latencies_s, time.monotonic() - start


def _producer_worker(
    gateway: str,
    inflight: int,
    duration_s: float,
    api: str,
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    out.put(asyncio.run(produce_calls(gateway, inflight, duration_s, api)))


async def produce_phase(
    gateway: str, inflight: int, duration_s: float, producers: int, api: str = "unary"
) -> dict[str, float]:
    if producers <= 1:
        latencies_s, wall_s = await produce_calls(gateway, inflight, duration_s, api)
    else:
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        workers = [
            context.Process(target=_producer_worker, args=(gateway, inflight, duration_s, api, out))
            for _ in range(producers)
        ]
        for worker in workers:
            worker.start()
        parts = [await asyncio.to_thread(out.get) for _ in workers]
        for worker in workers:
            worker.join()
        latencies_s = [latency for part, _ in parts for latency in part]
        wall_s = max(wall for _, wall in parts)
    return {
        "msgs_per_s": len(latencies_s) * BATCH / wall_s,
        "messages": len(latencies_s) * BATCH,
        "calls": len(latencies_s),
        "p50_ms": percentile(latencies_s, 0.5) * 1000,
        "p99_ms": percentile(latencies_s, 0.99) * 1000,
    }


async def pull_phase(
    stub: pb_grpc.GatewayAsyncStub, queues: int, pull_batch: int, encoding: Encoding
) -> dict[str, float]:
    totals = [0] * queues
    start = time.monotonic()

    async def puller(queue_id: int) -> None:
        offset = 0
        while True:
            answer = await stub.Pull(
                pb.PullRequest(
                    consumer_group="bench",
                    topic=TOPIC,
                    broker_name=BROKER,
                    queue_id=queue_id,
                    offset=offset,
                    max_messages=pull_batch,
                    encoding=encoding,
                ),
                timeout=30,
            )
            if answer.status == pb.PullResponse.NO_NEW_MESSAGE:
                return
            totals[queue_id] += len(answer.messages) or answer.record_count
            offset = answer.next_offset

    await asyncio.gather(*(puller(q) for q in range(queues)))
    wall_s = time.monotonic() - start
    return {"msgs_per_s": sum(totals) / wall_s, "messages": sum(totals)}


async def e2e_phase(
    stub: pb_grpc.GatewayAsyncStub, queues: int, rate: int, duration_s: float, encoding: Encoding
) -> dict[str, float]:
    starts: list[int] = []
    for queue_id in range(queues):
        offsets = await stub.GetQueueOffsets(
            pb.QueueOffsetsRequest(topic=TOPIC, broker_name=BROKER, queue_id=queue_id)
        )
        starts.append(offsets.max_offset)
    latencies_s: list[float] = []
    expected = int(rate * duration_s) // BATCH * BATCH
    done = asyncio.Event()
    pulls = [0, 0]  # answers, empty answers
    produce_s: list[float] = []  # the Produce calls' latencies

    async def consumer(queue_id: int) -> None:
        offset = starts[queue_id]
        while not done.is_set():
            answer = await stub.Pull(
                pb.PullRequest(
                    consumer_group="bench",
                    topic=TOPIC,
                    broker_name=BROKER,
                    queue_id=queue_id,
                    offset=offset,
                    max_messages=1024,
                    long_poll_timeout_ms=1_000,
                    encoding=encoding,
                ),
                timeout=30,
            )
            now_ns = time.time_ns()
            pulls[0] += 1
            pulls[1] += not (answer.messages or answer.record_count)
            stamps = [message.body[:STAMP_DIGITS] for message in answer.messages]
            stamps += body_stamps(answer.records, answer.record_count, STAMP_DIGITS)
            for stamp in stamps:
                latencies_s.append((now_ns - int(stamp)) / 1e9)
            offset = answer.next_offset
            if len(latencies_s) >= expected:
                done.set()

    consumers = [asyncio.ensure_future(consumer(q)) for q in range(queues)]
    await asyncio.sleep(0.5)  # the consumers are held
    interval_s = BATCH / rate
    start = time.monotonic()
    for index in range(expected // BATCH):
        await asyncio.sleep(max(0.0, start + index * interval_s - time.monotonic()))
        body = str(time.time_ns()).rjust(STAMP_DIGITS, "0").encode().ljust(BODY_BYTES, b" ")
        sent = time.monotonic()
        await stub.Produce(batch_request(body), timeout=30)
        produce_s.append(time.monotonic() - sent)
    try:
        await asyncio.wait_for(done.wait(), timeout=60)
    finally:
        for task in consumers:
            task.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
    return {
        "rate_msgs_per_s": rate,
        "messages": len(latencies_s),
        "produce_p50_ms": percentile(produce_s, 0.5) * 1000,
        "produce_p99_ms": percentile(produce_s, 0.99) * 1000,
        "pulls": pulls[0],
        "empty_pulls": pulls[1],
        "p50_ms": percentile(latencies_s, 0.5) * 1000,
        "p99_ms": percentile(latencies_s, 0.99) * 1000,
    }


async def run(gateway: str, args: argparse.Namespace) -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}

    async def measured(phase: str, body: Awaitable[dict[str, float]]) -> None:
        with py_spy(args.py_spy if args.py_spy_phase == phase else None):
            before, started = cpu_snapshot(), time.monotonic()
            outcome: dict[str, object] = dict(await body)
            wall_s = time.monotonic() - started
            messages = int(outcome["messages"])  # type: ignore[call-overload]
            outcome["cpu"] = cpu_report(before, cpu_snapshot(), wall_s, messages)
        results[phase] = outcome

    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = pb_grpc.GatewayStub(channel)
        await stub.CreateTopic(
            pb.CreateTopicRequest(
                topic=TOPIC, read_queue_nums=args.queues, write_queue_nums=args.queues
            ),
            timeout=30,
        )
        await asyncio.to_thread(settle)
        if "produce" in args.phases:
            await measured(
                "produce",
                produce_phase(
                    gateway, args.inflight, args.duration_s, args.producers, args.produce_api
                ),
            )
            await asyncio.sleep(2.0)  # let dispatch catch up
        if "pull" in args.phases:
            encoding = ENCODINGS[args.pull_encoding]
            await measured("pull", pull_phase(stub, args.queues, args.pull_batch, encoding))
        if "e2e" in args.phases:
            encoding = ENCODINGS[args.pull_encoding]
            await measured(
                "e2e", e2e_phase(stub, args.queues, args.rate, args.e2e_duration_s, encoding)
            )
    return results


def print_cpu(cpu: dict[str, dict[str, float]]) -> None:
    print(
        "  cpu: "
        + ", ".join(
            f"{name} {part['core_share']:.2f} core {part['us_per_msg']:.1f} us/msg"
            for name, part in cpu.items()
        )
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=10.0, help="produce phase length")
    parser.add_argument(
        "--inflight",
        type=int,
        default=8,
        help="produce calls in flight (--produce-api stream: requests in flight on the stream)",
    )
    parser.add_argument(
        "--produce-api",
        default="unary",
        choices=PRODUCE_APIS,
        help="produce phase: a Produce call per batch (unary, the default) or the batches "
        "on one ProduceStream per producer (stream)",
    )
    parser.add_argument("--queues", type=int, default=4, help="queues of the topic")
    parser.add_argument("--pull-batch", type=int, default=32, help="messages per Pull")
    parser.add_argument(
        "--pull-encoding",
        choices=sorted(ENCODINGS),
        default="records",
        help="pull and e2e phases: the stored records (what tide.client asks for; the "
        "default) or decoded messages",
    )
    parser.add_argument("--rate", type=int, default=5_000, help="e2e phase messages/s")
    parser.add_argument(
        "--e2e-duration-s", type=float, default=None, help="e2e phase length (--duration-s)"
    )
    parser.add_argument(
        "--producers", type=int, default=1, help="producer processes (each --inflight calls)"
    )
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma separated, of {', '.join(PHASES)}"
    )
    parser.add_argument("--py-spy", type=Path, default=None, help="py-spy output directory")
    parser.add_argument("--py-spy-phase", default="produce", choices=PHASES)
    parser.add_argument(
        "--metrics",
        default="off",
        choices=METRICS_MODES,
        help="Prometheus endpoints of the services: off (default), on, or both (compare)",
    )
    parser.add_argument(
        "--scrape-interval-s",
        type=float,
        default=15.0,
        help="with metrics on: scrape every endpoint this often (0: never; default 15)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help=f"--metrics both: runs each way (1..{MAX_ROUNDS})"
    )
    args = parser.parse_args()
    args.phases = [phase.strip() for phase in args.phases.split(",") if phase.strip()]
    if unknown := set(args.phases) - set(PHASES):
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds is {args.rounds}; give 1..{MAX_ROUNDS}")
    if args.scrape_interval_s < 0:
        parser.error("--scrape-interval-s must be >= 0")
    if args.e2e_duration_s is None:
        args.e2e_duration_s = args.duration_s
    return args


def run_cluster(args: argparse.Namespace, metrics: bool) -> dict[str, dict[str, object]]:
    """Start the cluster on a fresh store (metrics on or off), run the phases, stop it."""
    root = Path(tempfile.mkdtemp(prefix="tide-gateway-bench-"))
    loadavg_before = loadavg()
    try:
        with ExitStack() as stack:
            namesrv = stack.enter_context(
                service("nameserver", ["--listen", "127.0.0.1:0"], root, metrics)
            )
            storage_port, dispatch_port = free_port(), free_port()
            store = root / "store"
            stack.enter_context(
                service(
                    "storage",
                    [
                        "--listen",
                        f"127.0.0.1:{storage_port}",
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
                    metrics,
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
                        f"127.0.0.1:{storage_port}",
                    ],
                    root,
                    metrics,
                )
            )
            gateway = stack.enter_context(
                service("gateway", ["--listen", "127.0.0.1:0", "--namesrv", namesrv], root, metrics)
            )
            scrapes = stack.enter_context(scraper(args.scrape_interval_s if metrics else 0.0))
            results = asyncio.run(run(gateway, args))
            results["metrics"] = {"on": metrics, **scrapes}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["loadavg"] = {"before": loadavg_before, "after": loadavg()}
    return results


def print_results(args: argparse.Namespace, results: dict[str, dict[str, object]]) -> None:
    if "produce" in results:
        produce = results["produce"]
        print(
            f"produce ({args.produce_api}): {produce['msgs_per_s']:,.0f} msgs/s ({BODY_BYTES} B, "
            f"batches of {BATCH}, {args.producers} x {args.inflight} in flight); call p50 "
            f"{produce['p50_ms']:.1f} ms, p99 {produce['p99_ms']:.1f} ms"
        )
        print_cpu(produce["cpu"])  # type: ignore[arg-type]
    if "pull" in results:
        pull = results["pull"]
        print(
            f"pull: {pull['msgs_per_s']:,.0f} msgs/s ({args.pull_batch} per call, "
            f"{args.queues} queues)"
        )
        print_cpu(pull["cpu"])  # type: ignore[arg-type]
    if "e2e" in results:
        e2e = results["e2e"]
        print(
            f"e2e at {args.rate:,} msgs/s: send -> long-polling consumer p50 "
            f"{e2e['p50_ms']:.1f} ms, p99 {e2e['p99_ms']:.1f} ms ({e2e['messages']:,} messages, "
            f"{e2e['pulls']:,} pulls, {e2e['empty_pulls']:,} empty); its Produce calls p50 "
            f"{e2e['produce_p50_ms']:.1f} ms, p99 {e2e['produce_p99_ms']:.1f} ms"
        )
        print_cpu(e2e["cpu"])  # type: ignore[arg-type]
    load = results["loadavg"]
    print(f"  metrics {'on' if results['metrics']['on'] else 'off'}; loadavg {load}")


def _median(
    runs: list[dict[str, dict[str, object]]], pick: Callable[[dict[str, Any]], float]
) -> float:
    return round(statistics.median(pick(run) for run in runs), 2)


def _cpu_pick(phase: str, process: str) -> Callable[[dict[str, Any]], float]:
    return lambda run: float(run[phase]["cpu"][process]["us_per_msg"])


def overhead(runs: dict[str, list[dict[str, dict[str, object]]]]) -> dict[str, dict[str, float]]:
    """Medians of the off and on runs and the change in percent (on vs off)."""
    picks: dict[str, Callable[[dict[str, Any]], float]] = {}
    first = runs["off"][0]
    if "produce" in first:
        picks["produce_msgs_per_s"] = lambda r: float(r["produce"]["msgs_per_s"])
        picks["produce_p99_ms"] = lambda r: float(r["produce"]["p99_ms"])
        for name in ("gateway", "storage", "dispatch", "client"):
            picks[f"produce_{name}_us_per_msg"] = _cpu_pick("produce", name)
    if "e2e" in first:
        picks["e2e_p50_ms"] = lambda r: float(r["e2e"]["p50_ms"])
        picks["e2e_p99_ms"] = lambda r: float(r["e2e"]["p99_ms"])
    table: dict[str, dict[str, float]] = {}
    for key, pick in picks.items():
        off, on = _median(runs["off"], pick), _median(runs["on"], pick)
        change = round((on - off) / off * 100, 1) if off else 0.0
        table[key] = {"off": off, "on": on, "change_pct": change}
    return table


def record_cost_us(readers: list[Any], records: int = RECORD_COST_SAMPLES) -> float:
    """Microseconds one SDK histogram record costs in this process (what the gateway and
    the storage do once per Produce / Append call), with these metric readers."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    from tide.server._metrics import LATENCY_BUCKETS_S

    aggregation = ExplicitBucketHistogramAggregation(list(LATENCY_BUCKETS_S))
    provider = MeterProvider(
        metric_readers=readers, views=[View(instrument_name="*", aggregation=aggregation)]
    )
    histogram = provider.get_meter("bench").create_histogram("latency", unit="s")
    started = time.perf_counter()
    for _ in range(records):
        histogram.record(0.003)
    elapsed_s = time.perf_counter() - started
    provider.shutdown()
    return round(elapsed_s / records * 1e6, 3)


def record_costs() -> dict[str, float]:
    """One histogram record without a reader (metrics off) and with the Prometheus
    reader (--metrics-listen), best of 3."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry

    off = min(record_cost_us([]) for _ in range(3))
    on = min(
        record_cost_us([PrometheusMetricReader(registry=CollectorRegistry())]) for _ in range(3)
    )
    return {"off_us": off, "on_us": on, "extra_us": round(on - off, 3)}


def compare(args: argparse.Namespace) -> None:
    """--metrics both: off and on runs in ABBA order (off on, on off, ...: a load that
    drifts during the runs hits both alike), then the medians and their difference."""
    runs: dict[str, list[dict[str, dict[str, object]]]] = {"off": [], "on": []}
    for round_index in range(args.rounds):
        for mode in ("off", "on") if round_index % 2 == 0 else ("on", "off"):
            print(f"round {round_index + 1}/{args.rounds}, metrics {mode}:", flush=True)
            results = run_cluster(args, metrics=mode == "on")
            print_results(args, results)
            runs[mode].append(results)
    table = overhead(runs)
    print(f"metrics on vs off, medians of {args.rounds} run(s) each:")
    for key, row in table.items():
        print(f"  {key}: off {row['off']:,} on {row['on']:,} ({row['change_pct']:+.1f} %)")
    costs = record_costs()
    print(
        f"one latency histogram record: {costs['off_us']} us without a reader, "
        f"{costs['on_us']} us with the Prometheus reader (loadavg {loadavg()})"
    )
    OVERHEAD_RESULTS.parent.mkdir(exist_ok=True)
    document = {
        "args": {**vars(args), "py_spy": str(args.py_spy) if args.py_spy else None},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "overhead": table,
        "histogram_record": costs,
        "runs": runs,
    }
    OVERHEAD_RESULTS.write_text(json.dumps(document, indent=2) + "\n")


def main() -> None:
    args = parse_args()
    if args.metrics == "both":
        compare(args)
        return
    results = run_cluster(args, metrics=args.metrics == "on")
    print_results(args, results)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "args": {**vars(args), "py_spy": str(args.py_spy) if args.py_spy else None},
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                **results,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()

"""Tide against what a user would pick instead: Redis Streams (redis-py) and NATS
JetStream (nats-py), the same shapes in the same run, alternating.

Shapes (issue 21, target 6):

* ``batch``: 128 B messages in batches of 100, one producer, one consumer keeping up.
  Tide: ``tide bench run 1-topic-4-queues-128b-batch100-stream`` (the load generator
  of docs/benchmarks.md) against ``--gateway``; ``tide-fuller`` the same with fuller
  pulls (each pull waits for 1,024 messages, at most 50 ms: ``min_messages``,
  docs/client.md), what a consumer that wants throughput asks. Redis: a pipeline of 100 ``XADD`` per
  round trip; the consumer ``XREADGROUP`` (up to 1,000) then ``XACK`` of what it read.
  NATS: 100 ``js.publish`` awaited together (each acknowledged by the stream); the
  consumer a pull subscription fetching up to 1,000, acknowledging the last
  (``AckPolicy.ALL``). Producer and consumer are processes of their own.
* ``single``: 16 application threads each sending single 1 KiB messages, no consumer.
  Tide: one ``tide.client.Producer`` shared by 16 threads calling ``send`` (accumulating,
  its defaults), and the same with accumulation off (``batch_max_messages=1``,
  ``async_threads=16``: one call per send, 16 at once, as ``send`` did before issue 21).
  Redis: 16 threads calling ``XADD`` (a pool of 16 connections). NATS: 16 concurrent
  callers awaiting ``js.publish`` (nats-py has no blocking API).

Redis and NATS are started here (on free ports, in a temporary directory) when
``redis-server`` / ``nats-server`` are on the PATH (Debian: ``apt-get install -y
redis-server nats-server``) and their clients are installed (``pip install -e
'.[bench]'``); otherwise the peer is skipped with a line saying so. Tide needs a running
cluster (``tide up``). Each figure: messages per second over the measured window, after
a warm-up; publish rates count acknowledged messages only.

    python -m bench.peers --gateway 127.0.0.1:8081 --rounds 2 --json > peers.json

With ``--tide-pid gateway=PID`` (and storage=, dispatch=) the single shape also reports
the CPU per message of those processes and of the client (``/proc/PID/stat``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

SHAPES = ("batch", "single")
BATCH_MESSAGES = 100
BATCH_BODY_BYTES = 128
SINGLE_BODY_BYTES = 1024
THREADS = 16
READ_COUNT = 1_000  # messages per XREADGROUP / fetch
READ_BLOCK_MS = 100
# Redis keeps the stream near this many entries (approximate trimming: the consumer keeps
# up, so what is trimmed was read; it bounds the server's memory).
STREAM_MAX_LEN = 500_000
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
TIDE_BENCH_TIMEOUT_S = 300.0
SPAWN_S = 2.0  # a spawned process imports its client first: the warm-up starts after
DRAIN_TIMEOUT_S = 60.0  # the longest a consumer may take to drain after the window


# -- timing ------------------------------------------------------------------------------


class Window:
    """Counts inside the measured window of one case: from ``start_s`` (monotonic: the
    clock is the machine's, shared by the processes of a case) for ``duration_s``."""

    def __init__(self, start_s: float, duration_s: float) -> None:
        self.start_s = start_s
        self.end_s = start_s + duration_s
        self.duration_s = duration_s
        self._lock = threading.Lock()
        self.count = 0

    @classmethod
    def after(cls, warmup_s: float, duration_s: float) -> Window:
        return cls(time.monotonic() + warmup_s, duration_s)

    def running(self) -> bool:
        return time.monotonic() < self.end_s

    def add(self, count: int) -> None:
        if self.start_s <= time.monotonic() < self.end_s:
            with self._lock:
                self.count += count

    def rate(self) -> float:
        return self.count / self.duration_s


def body(size: int) -> bytes:
    """``size`` bytes starting with the send time (ns, 16 hex digits)."""
    return (b"%016x" % time.time_ns()).ljust(size, b"x")


def e2e_ms(payload: bytes) -> float:
    return (time.time_ns() - int(payload[:16], 16)) / 1e6


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1)


# -- servers -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, proc: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with status {proc.returncode} at start")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)  # polling a port that is not open yet
    raise RuntimeError(f"{name} did not listen on {port} within {START_TIMEOUT_S:g} s")


@contextlib.contextmanager
def server(argv: list[str], port: int, name: str) -> Iterator[int]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc, name)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)


def redis_server(workdir: Path) -> contextlib.AbstractContextManager[int]:
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(workdir)]
    return server(argv, port, "redis-server")


def nats_server(workdir: Path) -> contextlib.AbstractContextManager[int]:
    port = free_port()
    argv = ["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(workdir)]
    return server(argv, port, "nats-server")


def missing(peer: str) -> str | None:
    """Why ``peer`` cannot run here (None: it can)."""
    binary, module, package = {
        "redis": ("redis-server", "redis", "redis"),
        "nats": ("nats-server", "nats", "nats-py"),
    }[peer]
    if shutil.which(binary) is None:
        return f"{binary} is not installed (Debian: apt-get install -y {binary})"
    try:
        __import__(module)
    except ImportError:
        return f"the {package} client is not installed (pip install -e '.[bench]')"
    return None


# -- Redis Streams -----------------------------------------------------------------------


def redis_batch_producer(port: int, stream: str, start_s: float, duration_s: float) -> float:
    import redis

    client = redis.Redis(port=port)
    window = Window(start_s, duration_s)
    while window.running():
        pipe = client.pipeline(transaction=False)
        for _ in range(BATCH_MESSAGES):
            pipe.xadd(
                stream, {"b": body(BATCH_BODY_BYTES)}, maxlen=STREAM_MAX_LEN, approximate=True
            )
        pipe.execute()
        window.add(BATCH_MESSAGES)
    return window.rate()


def redis_consumer(port: int, stream: str, start_s: float, duration_s: float, out: Any) -> None:
    """Read and acknowledge until a second after the window and the stream is drained."""
    import redis

    client = redis.Redis(port=port)
    window, stop_s = Window(start_s, duration_s), start_s + duration_s + 1.0
    latencies: list[float] = []
    while True:
        answer = client.xreadgroup("g", "c", {stream: ">"}, count=READ_COUNT, block=READ_BLOCK_MS)
        if not answer:
            if time.monotonic() >= stop_s:
                break
            continue
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], answer[0][1])  # type: ignore[index]
        client.xack(stream, "g", *[entry_id for entry_id, _ in entries])
        window.add(len(entries))
        latencies.append(e2e_ms(entries[-1][1][b"b"]))
    out.put({"consume_msgs_per_s": round(window.rate()), "e2e_p99_ms": p99(latencies)})


def redis_batch(port: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
    import redis

    stream = f"peers-{uuid.uuid4().hex[:8]}"
    redis.Redis(port=port).xgroup_create(stream, "g", id="$", mkstream=True)
    return with_consumer(
        redis_consumer, (port, stream), redis_batch_producer, (port, stream), warmup_s, duration_s
    )


def redis_single(port: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
    import redis

    pool = redis.ConnectionPool(port=port, max_connections=THREADS)
    stream = f"peers-{uuid.uuid4().hex[:8]}"

    def send(window: Window) -> None:
        client = redis.Redis(connection_pool=pool)
        while window.running():
            client.xadd(
                stream, {"b": body(SINGLE_BODY_BYTES)}, maxlen=STREAM_MAX_LEN, approximate=True
            )
            window.add(1)

    return {"publish_msgs_per_s": threads_rate(send, warmup_s, duration_s)}


# -- NATS JetStream ----------------------------------------------------------------------


async def _nats(port: int) -> Any:
    import nats

    return await nats.connect(f"nats://127.0.0.1:{port}")


async def _nats_stream(port: int, subject: str) -> None:
    connection = await _nats(port)
    js = connection.jetstream()
    await js.add_stream(name=subject.replace(".", "_"), subjects=[subject])
    await connection.close()


def nats_batch_producer(port: int, subject: str, start_s: float, duration_s: float) -> float:
    async def run() -> float:
        connection = await _nats(port)
        js = connection.jetstream()
        window = Window(start_s, duration_s)
        while window.running():
            await asyncio.gather(
                *(js.publish(subject, body(BATCH_BODY_BYTES)) for _ in range(BATCH_MESSAGES))
            )
            window.add(BATCH_MESSAGES)
        await connection.close()
        return window.rate()

    return asyncio.run(run())


def nats_consumer(port: int, subject: str, start_s: float, duration_s: float, out: Any) -> None:
    async def run() -> None:
        import nats.errors
        from nats.js.api import AckPolicy, ConsumerConfig

        connection = await _nats(port)
        js = connection.jetstream()
        config = ConsumerConfig(ack_policy=AckPolicy.ALL)
        subscription = await js.pull_subscribe(subject, "g", config=config)
        window, stop_s = Window(start_s, duration_s), start_s + duration_s + 1.0
        latencies: list[float] = []
        while True:
            try:
                messages = await subscription.fetch(READ_COUNT, timeout=READ_BLOCK_MS / 1000)
            except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises either
                messages = []
            if not messages:  # nothing within the wait (nats-py may also answer empty)
                if time.monotonic() >= stop_s:
                    break
                continue
            await messages[-1].ack()  # AckPolicy.ALL: every message before it too
            window.add(len(messages))
            latencies.append(e2e_ms(messages[-1].data))
        await connection.close()
        out.put({"consume_msgs_per_s": round(window.rate()), "e2e_p99_ms": p99(latencies)})

    asyncio.run(run())


def nats_batch(port: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
    subject = f"peers.b{uuid.uuid4().hex[:8]}"
    asyncio.run(_nats_stream(port, subject))
    return with_consumer(
        nats_consumer, (port, subject), nats_batch_producer, (port, subject), warmup_s, duration_s
    )


def nats_single(port: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
    subject = f"peers.s{uuid.uuid4().hex[:8]}"
    asyncio.run(_nats_stream(port, subject))

    async def run() -> float:
        connection = await _nats(port)
        js = connection.jetstream()
        window = Window.after(warmup_s, duration_s)

        async def caller() -> None:
            while window.running():
                await js.publish(subject, body(SINGLE_BODY_BYTES))
                window.add(1)

        await asyncio.gather(*(caller() for _ in range(THREADS)))
        await connection.close()
        return window.rate()

    return {"publish_msgs_per_s": round(asyncio.run(run()))}


# -- Tide --------------------------------------------------------------------------------


# The batch shape's consumer with fuller pulls (``tide-fuller``): workload fields.
FULLER_PULLS = ("pull_batch=1024", "pull_min_messages=1024", "pull_min_wait_ms=50")


def tide_batch(
    gateway: str, warmup_s: float, duration_s: float, settings: tuple[str, ...] = ()
) -> dict[str, Any]:
    argv = [sys.executable, "-m", "tide.cli", "bench", "run"]
    argv += ["1-topic-4-queues-128b-batch100-stream", "--gateway", gateway, "--json", "--quiet"]
    argv += ["--set", f"warmup_s={warmup_s:g}", "--set", f"duration_s={duration_s:g}"]
    for setting in settings:
        argv += ["--set", setting]
    done = subprocess.run(argv, capture_output=True, timeout=TIDE_BENCH_TIMEOUT_S, check=False)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"tide bench failed: {done.stderr.decode()[-2000:]}")
    report = json.loads(done.stdout)
    return {
        "publish_msgs_per_s": round(report["publish"]["msgs_per_s"]),
        "consume_msgs_per_s": round(report["consume"]["msgs_per_s"]),
        "e2e_p99_ms": report["e2e_latency_ms"].get("p99"),
    }


def cpu_s(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process, and of this one ("client")."""
    ticks = os.sysconf("SC_CLK_TCK")
    spent = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        spent[name] = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    own = os.times()
    spent["client"] = own.user + own.system
    return spent


def tide_single(
    gateway: str,
    warmup_s: float,
    duration_s: float,
    *,
    accumulate: bool,
    pids: dict[str, int],
) -> dict[str, Any]:
    from tide.client import Admin, Producer

    topic = f"peers_{uuid.uuid4().hex[:8]}"
    with Admin(gateway) as admin:
        admin.create_topic(topic, read_queue_nums=4)
    options: dict[str, Any] = {} if accumulate else {"batch_max_messages": 1, "async_threads": 16}
    try:
        with Producer(gateway, **options) as producer:

            def send(window: Window) -> None:
                while window.running():
                    producer.send(topic, body(SINGLE_BODY_BYTES))
                    window.add(1)

            before = cpu_s(pids)
            rate = threads_rate(send, warmup_s, duration_s)
            after = cpu_s(pids)
            calls = producer._accumulator.calls_sent
            messages = producer._accumulator.messages_sent
    finally:
        with Admin(gateway) as admin:
            admin.delete_topic(topic)
    # CPU per message of each process over the whole case (warm-up too: all its messages)
    cpu_us = {k: round((after[k] - before[k]) / max(1, messages) * 1e6) for k in after}
    return {
        "publish_msgs_per_s": rate,
        "messages_per_call": round(messages / max(1, calls), 1),
        "cpu_us_per_msg": cpu_us,
    }


# -- drivers -----------------------------------------------------------------------------


def threads_rate(send: Callable[[Window], None], warmup_s: float, duration_s: float) -> int:
    window = Window.after(warmup_s, duration_s)
    threads = [threading.Thread(target=send, args=(window,)) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return round(window.rate())


def with_consumer(
    consume: Callable[..., None],
    consume_args: tuple[Any, ...],
    produce: Callable[..., float],
    produce_args: tuple[Any, ...],
    warmup_s: float,
    duration_s: float,
) -> dict[str, Any]:
    """The consumer and the producer in processes of their own, measuring the same window
    (it starts ``warmup_s`` from now, after their start-up); the consumer drains until a
    second after it."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_s = time.monotonic() + SPAWN_S + warmup_s
    consumer = context.Process(target=consume, args=(*consume_args, start_s, duration_s, out))
    consumer.start()
    with context.Pool(1) as pool:
        rate = pool.apply(produce, (*produce_args, start_s, duration_s))
    try:
        report = out.get(timeout=DRAIN_TIMEOUT_S)  # it stops once drained after the window
    except queue.Empty:
        report = {"error": f"the consumer gave no report (exit code {consumer.exitcode})"}
    consumer.join(STOP_TIMEOUT_S)
    return {"publish_msgs_per_s": round(rate), **report}


def run(args: argparse.Namespace) -> dict[str, Any]:
    say = print if not args.json else lambda *a: print(*a, file=sys.stderr)
    skipped = {peer: why for peer in ("redis", "nats") if (why := missing(peer))}
    for peer, why in skipped.items():
        say(f"skipping {peer}: {why}")
    results: list[dict[str, Any]] = []
    warm, dur = args.warmup_s, args.duration_s
    pids = dict(args.tide_pid)
    with tempfile.TemporaryDirectory(prefix="tide-peers-") as tmp, contextlib.ExitStack() as stack:
        ports = {}
        if "redis" not in skipped:
            ports["redis"] = stack.enter_context(redis_server(Path(tmp)))
        if "nats" not in skipped:
            ports["nats"] = stack.enter_context(nats_server(Path(tmp)))
        cases: dict[str, list[tuple[str, Callable[[], dict[str, Any]]]]] = {
            "batch": [
                ("tide", lambda: tide_batch(args.gateway, warm, dur)),
                ("tide-fuller", lambda: tide_batch(args.gateway, warm, dur, FULLER_PULLS)),
                ("redis", lambda: redis_batch(ports["redis"], warm, dur)),
                ("nats", lambda: nats_batch(ports["nats"], warm, dur)),
            ],
            "single": [
                ("tide", lambda: tide_single(args.gateway, warm, dur, accumulate=True, pids=pids)),
                (
                    "tide-unbatched",
                    lambda: tide_single(args.gateway, warm, dur, accumulate=False, pids=pids),
                ),
                ("redis", lambda: redis_single(ports["redis"], warm, dur)),
                ("nats", lambda: nats_single(ports["nats"], warm, dur)),
            ],
        }
        for round_index in range(args.rounds):
            for shape in args.shapes:
                for system, case in cases[shape]:
                    if system in skipped:
                        continue
                    say(f"round {round_index + 1}: {shape} {system} ...")
                    figures: dict[str, Any] = {
                        "round": round_index + 1,
                        "shape": shape,
                        "system": system,
                    }
                    try:
                        figures.update(case())
                    except Exception as exc:  # one failed case: say so, run the others
                        figures.update(publish_msgs_per_s=None, error=repr(exc))
                    say(f"  {figures}")
                    results.append(figures)
    return {
        "machine": {"cpus": os.cpu_count(), "loadavg": list(os.getloadavg())},
        "warmup_s": warm,
        "duration_s": dur,
        "skipped": skipped,
        "results": results,
        "ratios": ratios(results),
    }


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round and shape: each Tide case's publish rate over each peer's."""
    out = []
    for row in results:
        if not row["system"].startswith("tide"):
            continue
        for peer in results:
            same = peer["round"] == row["round"] and peer["shape"] == row["shape"]
            rates = row["publish_msgs_per_s"] and peer["publish_msgs_per_s"]
            failed = "error" in row or "error" in peer
            if same and not peer["system"].startswith("tide") and rates and not failed:
                ratio = row["publish_msgs_per_s"] / peer["publish_msgs_per_s"]
                out.append(
                    {
                        "round": row["round"],
                        "shape": row["shape"],
                        "tide": row["system"],
                        "tide_over": peer["system"],
                        "ratio": round(ratio, 2),
                    }
                )
    return out


def tide_pid(text: str) -> tuple[str, int]:
    """``--tide-pid NAME=PID``, checked: (name, pid)."""
    name, _, pid = text.partition("=")
    if not name or not pid.isdigit():
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise argparse.ArgumentTypeError(f"give NAME=PID, e.g. gateway=1234 (got {shown!r})")
    return name, int(pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", default="127.0.0.1:8081", help="a running Tide gateway")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=2, help="each case this many times")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--tide-pid",
        action="append",
        type=tide_pid,
        default=[],
        metavar="NAME=PID",
        help="a Tide process on this machine (e.g. gateway=1234; repeatable): the single "
        "shape reports its CPU per message, and the client's",
    )
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for row in report["ratios"]:
            print(
                f"round {row['round']} {row['shape']}: {row['tide']} / {row['tide_over']} "
                f"= {row['ratio']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``run_workload``: create the topics, run producers and consumers, return the report.

``run_baseline``: the same producers against a bare gRPC echo of ``Gateway/Produce``
(:mod:`tide.bench._echo`) in a process of its own on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import platform
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tide.bench._load import (
    LoadState,
    QueueRef,
    Sample,
    consume_queue,
    open_channel,
    produce,
    request_template,
    sample,
)
from tide.bench._procs import START_DELAY_S, WorkerPool, consumer_plans, producer_plans
from tide.bench._workload import Workload
from tide.client import Admin
from tide.client._rpc import ClientTls
from tide.spawn import running

DRAIN_TIMEOUT_S = 60.0
SERVER_READY_TIMEOUT_S = 30.0
SERVER_STOP_TIMEOUT_S = 10.0
BASELINE_WARMUP_S = 1.0
BASELINE_DURATION_S = 5.0
MAX_SAMPLE_INTERVAL_S = 1.0
MIN_SAMPLE_INTERVAL_S = 0.25
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PERM_READ = 4
MB = 1_000_000

Progress = Callable[[str], None]


@dataclass
class _Window:
    """Counters at the start and the end of the measured window."""

    start: float = 0.0
    end: float = 0.0
    published: tuple[int, int] = (0, 0)
    consumed: tuple[int, int] = (0, 0)
    cpu_s: tuple[float, float] = (0.0, 0.0)
    backlog_end: int = 0
    measuring: bool = False
    timeline: list[Sample] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)  # the load generator's

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)


def client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def loadavg() -> list[float] | None:
    try:
        return [float(part) for part in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def sample_interval_s(workload: Workload) -> float:
    """One sample a second, or ten per run for runs shorter than 10 s."""
    return max(MIN_SAMPLE_INTERVAL_S, min(MAX_SAMPLE_INTERVAL_S, workload.duration_s / 10))


def topic_names(workload: Workload, run_id: str) -> list[str]:
    return [f"bench-{workload.name}-{run_id}-{index}" for index in range(workload.topics)]


def readable_queues(admin: Admin, topic: str) -> list[QueueRef]:
    route = admin.route(topic)
    return [
        QueueRef(topic, data.broker_name, queue_id)
        for data in sorted(route.queue_datas, key=lambda data: data.broker_name)
        if data.perm & PERM_READ
        for queue_id in range(data.read_queue_nums)
    ]


def run_workload(
    workload: Workload,
    gateway: str,
    *,
    keep_topics: bool = False,
    progress: Progress | None = None,
    tls: ClientTls = False,
) -> dict[str, Any]:
    """Run ``workload`` against ``gateway``: create its topics (on every master broker),
    consume and produce, drain, delete the topics (unless ``keep_topics``); the report as
    a JSON-able dict (see ``docs/benchmarks.md``)."""
    say = progress or (lambda _text: None)
    run_id = secrets.token_hex(3)
    topics = topic_names(workload, run_id)
    started_at = dt.datetime.now(dt.UTC)
    with Admin(gateway, tls=tls) as admin:
        created: list[str] = []
        try:
            queues: list[list[QueueRef]] = []
            for topic in topics:
                brokers = admin.create_topic(topic, read_queue_nums=workload.queues_per_topic)
                created.append(topic)
                say(f"created topic {topic} on {', '.join(brokers)}")
                queues.append(readable_queues(admin, topic))
            window, state = asyncio.run(
                _drive(workload, gateway, topics, queues, f"bench-{run_id}", say, tls)
            )
        finally:
            if not keep_topics:
                for topic in created:
                    with contextlib.suppress(Exception):
                        admin.delete_topic(topic)
    return _report(workload, gateway, started_at, topics, queues, window, state)


@dataclass
class _Load:
    """The run's producers and consumers: tasks of this process, or the tasks following
    the worker processes of a pool (``producer_processes`` / ``consumer_processes``)."""

    producers: list[asyncio.Task[None]] = field(default_factory=list)
    consumers: list[asyncio.Task[None]] = field(default_factory=list)
    producer_pool: WorkerPool | None = None
    consumer_pool: WorkerPool | None = None
    channels: list[Any] = field(default_factory=list)
    schedule: tuple[float, float, float] = (0.0, 0.0, 0.0)  # start, measure, end (monotonic)
    tls: ClientTls = False  # tide.client's tls= for every channel to the gateway

    @property
    def local_tasks(self) -> list[asyncio.Task[None]]:
        return [
            *(self.producers if self.producer_pool is None else []),
            *(self.consumers if self.consumer_pool is None else []),
        ]

    def pools(self) -> list[WorkerPool]:
        return [pool for pool in (self.producer_pool, self.consumer_pool) if pool is not None]


async def _drive(
    workload: Workload,
    target: str,
    topics: list[str],
    queues: list[list[QueueRef]],
    group: str,
    say: Progress,
    tls: ClientTls = False,
) -> tuple[_Window, LoadState]:
    state = LoadState()
    window = _Window()
    load = _Load(tls=tls)
    try:
        # Consumers first, from the end of every queue; their long polls are held before
        # the first message goes out.
        await _start_consumers(workload, target, queues, group, state, load, say)
        await _start_producers(workload, target, topics, state, load, say)
        await _measure(workload, state, window, load, say)
        if load.consumers:
            await _drain(state, say, load.consumers)
        if load.consumer_pool is not None:
            await load.consumer_pool.stop()
        _take_windows(load, state, window)
    finally:
        await _stop(load, state)
    return window, state


async def _start_consumers(
    workload: Workload,
    target: str,
    queues: list[list[QueueRef]],
    group: str,
    state: LoadState,
    load: _Load,
    say: Progress,
) -> None:
    if queues and workload.consumer_processes > 1:
        say(f"starting {workload.consumer_processes} consumer processes")
        load.consumer_pool = WorkerPool(
            consumer_plans(workload, target, queues, group, load.tls), state
        )
        await load.consumer_pool.start()  # every queue positioned
        return
    for topic_queues in queues:
        for consumer in range(workload.consumers_per_topic):
            channel = open_channel(target, load.tls)
            load.channels.append(channel)
            mine = topic_queues[consumer :: workload.consumers_per_topic]
            load.consumers.extend(
                asyncio.create_task(consume_queue(channel, state, group, ref, workload))
                for ref in mine
            )
    await asyncio.sleep(0.3)  # the consumers' first long polls reach the gateway


async def _start_producers(
    workload: Workload,
    target: str,
    topics: list[str],
    state: LoadState,
    load: _Load,
    say: Progress,
) -> None:
    """Start the producers: at once in this process, or (with worker pools) every pool
    on one schedule a moment ahead."""
    if workload.producer_processes > 1:
        say(f"starting {workload.producer_processes} producer processes")
        load.producer_pool = WorkerPool(producer_plans(workload, target, topics, load.tls), state)
        await load.producer_pool.start()
    start = time.monotonic() + (START_DELAY_S if load.pools() else 0.0)
    measure = start + workload.warmup_s
    load.schedule = (start, measure, measure + workload.duration_s)
    if load.consumer_pool is not None:
        load.consumers = load.consumer_pool.go(*load.schedule)
    if load.producer_pool is not None:
        load.producers = load.producer_pool.go(*load.schedule)
        return
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    rate = workload.rate / workload.producers
    for topic in topics:
        template = request_template(
            topic,
            workload.message_size,
            workload.batch_size,
            pack_answers=workload.produce_api == "stream",
        )
        for _ in range(workload.producers_per_topic):
            channel = open_channel(target, load.tls)
            load.channels.append(channel)
            load.producers.append(
                asyncio.create_task(produce(channel, state, template, workload, rate))
            )


async def _measure(
    workload: Workload, state: LoadState, window: _Window, load: _Load, say: Progress
) -> None:
    """Warm up, measure ``duration_s``, stop the producers (on ``load.schedule``). A
    producer or consumer that fails (not an RPC error: those are counted) ends it."""
    start, measure, end = load.schedule
    sampler = asyncio.create_task(
        sample(state, sample_interval_s(workload), lambda: window.measuring, start, window.timeline)
    )
    counters = state.counters
    running = load.producers + load.consumers
    try:
        if workload.warmup_s:
            say(f"warming up for {workload.warmup_s:g} s")
        await _sleep_unless_failed(measure - time.monotonic(), running)
        state.publish_latency.reset()
        state.e2e_latency.reset()
        window.start = time.monotonic()
        window.published = (counters.published, 0)
        window.consumed = (counters.consumed, 0)
        window.cpu_s = (client_cpu_s(), 0.0)
        window.measuring = True
        say(f"measuring for {workload.duration_s:g} s")
        await _sleep_unless_failed(end - time.monotonic(), running)
        state.stop_producing.set()
        window.end = time.monotonic()
        window.published = (window.published[0], counters.published)
        window.consumed = (window.consumed[0], counters.consumed)
        window.cpu_s = (window.cpu_s[0], client_cpu_s())
        window.backlog_end = max(0, counters.published - counters.consumed)
        window.measuring = False
        await asyncio.gather(*load.producers)  # the calls in flight (pools: their last reports)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)


def _take_windows(load: _Load, state: LoadState, window: _Window) -> None:
    """With worker pools: the measured window as the workers recorded it (their counts
    and latencies inside it exactly; the main process saw them a report late), with
    their CPU; and every process of the load generator."""
    main_cpu = window.cpu_s[1] - window.cpu_s[0]
    local_producers = 0 if load.producer_pool else len(load.producers)
    local_consumers = 0 if load.consumer_pool else len(load.consumers)
    processes: list[dict[str, Any]] = [
        {
            "role": "main",
            "pid": os.getpid(),
            "producers": local_producers,
            "consumed_queues": local_consumers,
            "window_cpu_s": round(main_cpu, 3),
        }
    ]
    if load.pools():
        window.start, window.end = load.schedule[1:]
    if load.producer_pool is not None:
        window.published = (0, load.producer_pool.window_published)
        state.publish_latency = load.producer_pool.window_publish_latency
    if load.consumer_pool is not None:
        window.consumed = (0, load.consumer_pool.window_consumed)
        state.e2e_latency = load.consumer_pool.window_e2e_latency
    for pool in load.pools():
        window.cpu_s = (window.cpu_s[0], window.cpu_s[1] + pool.window_cpu_s())
        processes.extend(pool.summaries())
    window.processes = processes


async def _stop(load: _Load, state: LoadState) -> None:
    """Stop and cancel the local tasks, close the channels, end the worker processes."""
    state.stop_producing.set()
    state.stop_consuming.set()
    tasks = load.producers + load.consumers
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for channel in load.channels:
        await channel.close(None)
    for pool in load.pools():
        pool.close()
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


async def _sleep_unless_failed(seconds: float, tasks: list[asyncio.Task[None]]) -> None:
    """Sleep; a task that raised ends the run at once."""
    seconds = max(0.0, seconds)
    done, _ = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        task.result()


async def _drain(state: LoadState, say: Progress, consumers: list[asyncio.Task[None]]) -> None:
    """Wait until the consumers have everything that was published (or time runs out;
    a consumer that failed ends it at once)."""
    counters = state.counters
    begin = time.monotonic()
    if counters.consumed < counters.published:
        say(f"draining {counters.published - counters.consumed:,} messages")
    while counters.consumed < counters.published and time.monotonic() - begin < DRAIN_TIMEOUT_S:
        await _sleep_unless_failed(0.02, consumers)
    state.drain_s = time.monotonic() - begin


def _rates(count: int, seconds: float, size: int) -> tuple[float, float]:
    return round(count / seconds, 1), round(count * size / seconds / MB, 3)


def _report(
    workload: Workload,
    gateway: str,
    started_at: dt.datetime,
    topics: list[str],
    queues: list[list[QueueRef]],
    window: _Window,
    state: LoadState,
) -> dict[str, Any]:
    counters = state.counters
    published = window.published[1] - window.published[0]
    consumed = window.consumed[1] - window.consumed[0]
    publish_rate, publish_mb = _rates(published, window.seconds, workload.message_size)
    consume_rate, consume_mb = _rates(consumed, window.seconds, workload.message_size)
    cpu = window.cpu_s[1] - window.cpu_s[0]
    measured = [s.backlog for s in window.timeline if s.measuring]
    producer_only = workload.consumers == 0  # nothing to drain or to compare
    errors = (
        counters.publish_errors
        + counters.send_failed
        + counters.consume_errors
        + counters.offset_resets
    )
    return {
        "kind": "run",
        "workload": workload.to_dict(),
        "gateway": gateway,
        "started_at": started_at.isoformat(timespec="seconds"),
        "topics": topics,
        "queues": sum(len(q) for q in queues),
        "measured_s": round(window.seconds, 3),
        # when the window was, on the system's monotonic clock: another process (a
        # benchmark taking the servers' CPU over the same window) reads the same clock
        "window_monotonic_s": [round(window.start, 4), round(window.end, 4)],
        "publish": {"messages": published, "msgs_per_s": publish_rate, "mb_per_s": publish_mb},
        "consume": {"messages": consumed, "msgs_per_s": consume_rate, "mb_per_s": consume_mb},
        "backlog": {"end": window.backlog_end, "max": max(measured, default=0)},
        "publish_latency_ms": state.publish_latency.summary(),
        "e2e_latency_ms": state.e2e_latency.summary(),
        "totals": {
            "published": counters.published,
            "consumed": counters.consumed,
            "publish_calls": counters.publish_calls,
            "publish_errors": counters.publish_errors,
            "send_failed": counters.send_failed,
            "consume_errors": counters.consume_errors,
            "offset_resets": counters.offset_resets,
            "drain_s": round(state.drain_s, 3),
        },
        "errors": errors,
        "last_error": counters.last_error,
        "ok": errors == 0 and (producer_only or counters.published == counters.consumed),
        "client_cpu": {
            "cpu_s": round(cpu, 3),
            "core_share": round(cpu / window.seconds, 3),
            "us_per_msg": round(cpu / max(published, 1) * 1e6, 2),
        },
        "client_processes": window.processes,
        "machine": machine(),
        "timeline": [s.to_dict() for s in window.timeline],
        "publish_percentiles": _curve(state.publish_latency.total),
        "e2e_percentiles": _curve(state.e2e_latency.total),
        "baseline": None,
        "ratio_to_baseline": None,
    }


def _curve(histogram: Any) -> list[list[float]]:
    from tide.bench._stats import percentile_curve

    return [[round(p, 4), round(ms, 3)] for p, ms in percentile_curve(histogram)]


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg": loadavg(),
    }


# -- the baseline --------------------------------------------------------------------------


@contextlib.contextmanager
def server_process(module: list[str], name: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m MODULE... READY_FILE`` (a server that listens on a free port of
    127.0.0.1 and then writes ``{"listen": ADDRESS}`` to READY_FILE, as
    :func:`tide.bench._echo.write_ready` does): (address, process); stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix="tide-bench-server-") as directory:
        ready = Path(directory) / "ready.json"
        command = [sys.executable, "-m", *module, str(ready)]
        log_path = Path(directory) / "stderr.log"
        with running(
            command,
            ready,
            name,
            SERVER_READY_TIMEOUT_S,
            stderr_path=log_path,
            stdout=subprocess.DEVNULL,
            stop_timeout_s=SERVER_STOP_TIMEOUT_S,
        ) as server:
            yield server.listen, server.proc


def echo_server() -> contextlib.AbstractContextManager[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m tide.bench._echo`` on a free port of 127.0.0.1: (address, process)."""
    return server_process(["tide.bench._echo"], "the echo server")


def run_baseline(
    workload: Workload,
    *,
    duration_s: float = BASELINE_DURATION_S,
    warmup_s: float = BASELINE_WARMUP_S,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The workload's producers (topics x producers, in-flight calls, batch and message
    size; no rate limit, no consumers) against a bare gRPC echo of ``Gateway/Produce``
    on this machine: what Python gRPC itself carries with this message shape."""
    say = progress or (lambda _text: None)
    shape = workload.replace(rate=0.0, warmup_s=warmup_s, duration_s=duration_s)
    with echo_server() as (address, proc):
        say(f"baseline: bare gRPC echo at {address} for {duration_s:g} s")
        server_before = process_cpu_s(proc.pid)
        window, state = asyncio.run(_drive(shape, address, topic_names(shape, "echo"), [], "", say))
        server_cpu = process_cpu_s(proc.pid) - server_before
    published = window.published[1] - window.published[0]
    msgs_per_s, mb_per_s = _rates(published, window.seconds, workload.message_size)
    cpu = window.cpu_s[1] - window.cpu_s[0]
    counters = state.counters
    return {
        "kind": "baseline",
        "workload": workload.to_dict(),
        "server": "bare gRPC echo of tide.v1.Gateway/Produce (tide.bench._echo)",
        "measured_s": round(window.seconds, 3),
        "publish": {"messages": published, "msgs_per_s": msgs_per_s, "mb_per_s": mb_per_s},
        "publish_latency_ms": state.publish_latency.summary(),
        "errors": counters.publish_errors + counters.send_failed,
        "last_error": counters.last_error,
        "client_cpu": {"cpu_s": round(cpu, 3), "core_share": round(cpu / window.seconds, 3)},
        "server_cpu": {
            "cpu_s": round(server_cpu, 3),
            "core_share": round(server_cpu / window.seconds, 3),
        },
        "client_processes": window.processes,
        "machine": machine(),
    }


def with_baseline(report: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """``report`` with the baseline and the ratio of the publish rates."""
    base_rate = baseline["publish"]["msgs_per_s"]
    ratio = report["publish"]["msgs_per_s"] / base_rate if base_rate else None
    return {
        **report,
        "baseline": baseline,
        "ratio_to_baseline": round(ratio, 4) if ratio is not None else None,
    }

"""Producers and consumers in OS processes of their own (``producer_processes`` /
``consumer_processes`` > 1).

One asyncio process spends ~6 us of CPU per message on gRPC's client side, so a single
load generator limits what it can measure. Here the producers are dealt round robin to
P processes and the consumers to C processes, started with ``multiprocessing`` (spawn):
producer process *i* runs producers *i*, *i + P*, ... of the run, each at the same
per-producer rate as in one process; consumer process *j* runs consumers *j*, *j + C*,
... (a consumer: the queues of its topic it long-polls).

The processes share the machine's monotonic clock (``CLOCK_MONOTONIC``), so the main
process hands every worker the same three instants: start, start of the measured
window, end. A worker reports over a pipe every :data:`REPORT_INTERVAL_S` and at each of
those instants: the counts since its last report and the HdrHistograms of the latencies
recorded meanwhile (publish, end-to-end), tagged with the phase they belong to (warm-up,
measured, after). The main process adds everything to its own counters and interval
histograms, so the timeline, the backlog and the drain work as with local producers and
consumers, and keeps the phases apart: the window's counts and latency histograms are
exactly what the workers recorded inside it (end-to-end: from the window's start until
the consumers stop, as in one process). Consumer processes start first and say they are
ready once every queue has its starting offset (the end of the queue), and they stop
when the main process says so (after the drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import resource
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from hdrh.histogram import HdrHistogram

from tide.bench._load import (
    LoadState,
    QueueRef,
    consume_queue,
    open_channel,
    produce,
    request_template,
)
from tide.bench._stats import Latency
from tide.bench._workload import Workload
from tide.client._rpc import ClientTls

REPORT_INTERVAL_S = 0.2
READY_TIMEOUT_S = 60.0  # a spawned process imports grpc and the protos first
START_DELAY_S = 0.1  # from "go" to the common start, so every worker gets it in time
STOP_TIMEOUT_S = 10.0
WARMUP, MEASURED, AFTER = "warmup", "measured", "after"
PRODUCER, CONSUMER = "producer", "consumer"
# The counters a worker reports, in this order.
COUNTERS = (
    "published",
    "publish_calls",
    "publish_errors",
    "send_failed",
    "consumed",
    "consume_errors",
    "offset_resets",
)


@dataclass(frozen=True)
class WorkerPlan:
    """What one process runs: producers (one per entry of ``topics``) or consumers (one
    per entry of ``consumers``: the queues it long-polls)."""

    role: str
    index: int
    target: str
    workload: Workload
    topics: tuple[str, ...] = ()
    consumers: tuple[tuple[QueueRef, ...], ...] = ()
    group: str = ""
    tls: ClientTls = False

    @property
    def name(self) -> str:
        return f"{self.role} process {self.index}"


def producer_plans(
    workload: Workload, target: str, topics: list[str], tls: ClientTls = False
) -> list[WorkerPlan]:
    """The run's producers (``producers_per_topic`` per topic, in topic order) dealt
    round robin to ``producer_processes`` processes."""
    producers = [topic for topic in topics for _ in range(workload.producers_per_topic)]
    count = workload.producer_processes
    return [
        WorkerPlan(
            PRODUCER, index, target, workload, topics=tuple(producers[index::count]), tls=tls
        )
        for index in range(count)
    ]


def consumer_plans(
    workload: Workload,
    target: str,
    queues: list[list[QueueRef]],
    group: str,
    tls: ClientTls = False,
) -> list[WorkerPlan]:
    """The run's consumers (``consumers_per_topic`` per topic, each with its share of the
    topic's queues) dealt round robin to ``consumer_processes`` processes."""
    per_topic = workload.consumers_per_topic
    consumers = [
        tuple(topic_queues[consumer::per_topic])
        for topic_queues in queues
        for consumer in range(per_topic)
    ]
    count = workload.consumer_processes
    return [
        WorkerPlan(
            CONSUMER,
            index,
            target,
            workload,
            consumers=tuple(consumers[index::count]),
            group=group,
            tls=tls,
        )
        for index in range(count)
    ]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- the worker process ------------------------------------------------------------------


def worker_main(plan: WorkerPlan, conn: Connection) -> None:
    """Entry point of a worker process (``multiprocessing`` target)."""
    try:
        asyncio.run(_work(plan, conn))
    except KeyboardInterrupt:
        pass
    except BaseException as exc:
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
    finally:
        conn.close()


class _Reporter:
    """Sends the counts and latencies recorded since the last report, with the phase."""

    def __init__(self, conn: Connection, state: LoadState) -> None:
        self.conn = conn
        self.state = state
        self.phase = WARMUP
        self.sent = self._counts()
        self.window: dict[str, int] = {"published": 0, "publish_calls": 0, "consumed": 0}

    def _counts(self) -> tuple[int, ...]:
        return tuple(getattr(self.state.counters, name) for name in COUNTERS)

    def flush(self) -> None:
        now = self._counts()
        delta = tuple(a - b for a, b in zip(now, self.sent, strict=True))
        publish, publish_sum_us = self.state.publish_latency.take()
        e2e, e2e_sum_us = self.state.e2e_latency.take()
        if self.phase == MEASURED:
            self.window["published"] += delta[0]
            self.window["publish_calls"] += int(publish.get_total_count())
            self.window["consumed"] += delta[4]
        if any(delta) or publish.get_total_count() or e2e.get_total_count():
            self.conn.send(
                (
                    "delta",
                    self.phase,
                    delta,
                    self.state.counters.last_error,
                    (_encode(publish), publish_sum_us),
                    (_encode(e2e), e2e_sum_us),
                )
            )
        self.sent = now

    async def every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.flush()


def _encode(histogram: Any) -> bytes:
    return histogram.encode() if histogram.get_total_count() else b""


async def _until(deadline: float, tasks: list[asyncio.Task[None]]) -> None:
    """Sleep until the monotonic ``deadline``; a task that raised ends the run at once."""
    timeout = max(0.0, deadline - time.monotonic())
    if not tasks:
        await asyncio.sleep(timeout)
        return
    done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        task.result()


def _start_producers(
    plan: WorkerPlan, state: LoadState, channels: list[Any]
) -> list[asyncio.Task[None]]:
    workload = plan.workload
    rate = workload.rate / workload.producers
    tasks = []
    for topic in plan.topics:
        channel = open_channel(plan.target, plan.tls)
        channels.append(channel)
        template = request_template(
            topic,
            workload.message_size,
            workload.batch_size,
            pack_answers=workload.produce_api == "stream",
        )
        tasks.append(asyncio.create_task(produce(channel, state, template, workload, rate)))
    return tasks


async def _start_consumers(
    plan: WorkerPlan, state: LoadState, channels: list[Any]
) -> list[asyncio.Task[None]]:
    """Every consumer's queues, long-polled from their current ends; returns once every
    queue has its starting offset."""
    queues = sum(len(consumer) for consumer in plan.consumers)
    positioned = asyncio.Semaphore(0)
    tasks: list[asyncio.Task[None]] = []
    for consumer in plan.consumers:
        channel = open_channel(plan.target, plan.tls)
        channels.append(channel)
        tasks.extend(
            asyncio.create_task(
                consume_queue(channel, state, plan.group, ref, plan.workload, positioned.release)
            )
            for ref in consumer
        )
    for _ in range(queues):
        await _until_acquired(positioned, tasks)
    return tasks


async def _until_acquired(semaphore: asyncio.Semaphore, tasks: list[asyncio.Task[None]]) -> None:
    acquire = asyncio.create_task(semaphore.acquire())
    done, _ = await asyncio.wait([acquire, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if acquire not in done:
        acquire.cancel()
        for task in done:
            task.result()
        raise RuntimeError("a consumer ended before it had its starting offset")


async def _work(plan: WorkerPlan, conn: Connection) -> None:
    state = LoadState()
    channels: list[Any] = []
    consumers: list[asyncio.Task[None]] = []
    producers: list[asyncio.Task[None]] = []
    try:
        if plan.role == CONSUMER:
            consumers = await _start_consumers(plan, state, channels)
        conn.send(("ready", os.getpid()))
        _, start, measure, end = await _receive(conn, READY_TIMEOUT_S)
        reporter = _Reporter(conn, state)
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        if plan.role == PRODUCER:
            producers = _start_producers(plan, state, channels)
        ticker = asyncio.create_task(reporter.every(REPORT_INTERVAL_S))
        await _until(measure, producers + consumers)
        reporter.flush()
        reporter.phase, cpu_begin = MEASURED, cpu_s()
        await _until(end, producers + consumers)
        state.stop_producing.set()
        reporter.flush()
        reporter.phase, cpu_end = AFTER, cpu_s()
        await asyncio.gather(*producers)  # the calls in flight
        if consumers:
            await _until_stopped(conn, consumers)
        ticker.cancel()
        reporter.flush()
        conn.send(("done", _summary(plan, state, reporter, cpu_end - cpu_begin)))
    finally:
        state.stop_producing.set()
        state.stop_consuming.set()
        tasks = producers + consumers
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close(None)


async def _receive(conn: Connection, timeout_s: float | None) -> Any:
    """The next message from the main process (its end of the pipe closed: "stop")."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(conn.fileno(), wake)
    try:
        await asyncio.wait_for(readable, timeout_s)
    except TimeoutError:
        raise RuntimeError(f"no word from the main process within {timeout_s:g} s") from None
    finally:
        loop.remove_reader(conn.fileno())
    try:
        return conn.recv()
    except EOFError:
        return ("stop",)


async def _until_stopped(conn: Connection, consumers: list[asyncio.Task[None]]) -> None:
    """Consume until the main process says stop (a consumer that raised ends it)."""
    waiter = asyncio.create_task(_receive(conn, None))
    done, _ = await asyncio.wait([waiter, *consumers], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    for task in done:
        if task is not waiter:
            task.result()


def _summary(plan: WorkerPlan, state: LoadState, reporter: _Reporter, cpu: float) -> dict[str, Any]:
    counters = state.counters
    summary: dict[str, Any] = {"role": plan.role, "pid": os.getpid()}
    if plan.role == PRODUCER:
        summary.update(
            producers=len(plan.topics),
            published=counters.published,
            publish_calls=counters.publish_calls,
            window_published=reporter.window["published"],
            window_calls=reporter.window["publish_calls"],
        )
    else:
        summary.update(
            consumers=len(plan.consumers),
            queues=sum(len(consumer) for consumer in plan.consumers),
            consumed=counters.consumed,
            window_consumed=reporter.window["consumed"],
        )
    summary["window_cpu_s"] = round(cpu, 3)  # the measured window's CPU
    return summary


# -- the main process's side ---------------------------------------------------------------


@dataclass
class _Worker:
    plan: WorkerPlan
    process: Any  # multiprocessing.context.SpawnProcess
    conn: Connection
    inbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    summary: dict[str, Any] | None = None


class WorkerPool:
    """Worker processes of one role: starts them and folds what they report into
    ``state``; the measured window as they recorded it in ``window_*``."""

    def __init__(self, plans: list[WorkerPlan], state: LoadState) -> None:
        self.plans = plans
        self.state = state
        self.window_publish_latency = Latency()
        self.window_e2e_latency = Latency()
        self.window_published = 0
        self.window_consumed = 0
        self.workers: list[_Worker] = []
        self.links: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Spawn every process and wait until each is ready (channels open; consumers:
        every queue positioned)."""
        context = multiprocessing.get_context("spawn")
        loop = asyncio.get_running_loop()
        for plan in self.plans:
            parent, child = context.Pipe()
            process = context.Process(
                target=worker_main, args=(plan, child), name=f"tide-bench-{plan.role}-{plan.index}"
            )
            process.daemon = True
            process.start()
            child.close()
            worker = _Worker(plan, process, parent)
            loop.add_reader(parent.fileno(), _drain_pipe, worker)
            self.workers.append(worker)
        for worker in self.workers:
            message = await self._next(worker, READY_TIMEOUT_S)
            if message[0] != "ready":
                raise RuntimeError(f"{worker.plan.name}: {message}")

    def go(self, start: float, measure: float, end: float) -> list[asyncio.Task[None]]:
        """Tell every process when to start, measure and stop (monotonic); one task per
        process that follows its reports (and raises when it fails)."""
        for worker in self.workers:
            worker.conn.send(("go", start, measure, end))
        self.links = [asyncio.create_task(self._follow(worker)) for worker in self.workers]
        return self.links

    async def stop(self) -> None:
        """Tell every process to stop (consumers: the drain is over); wait for their last
        reports."""
        for worker in self.workers:
            with contextlib.suppress(OSError):
                worker.conn.send(("stop",))
        await asyncio.gather(*self.links)

    async def _next(self, worker: _Worker, timeout_s: float | None = None) -> Any:
        try:
            message = await asyncio.wait_for(worker.inbox.get(), timeout_s)
        except TimeoutError:
            raise RuntimeError(f"{worker.plan.name} was not ready within {timeout_s:g} s") from None
        if message is None:
            worker.process.join(STOP_TIMEOUT_S)
            raise RuntimeError(f"{worker.plan.name} exited (code {worker.process.exitcode})")
        if message[0] == "error":
            raise RuntimeError(f"{worker.plan.name} failed: {message[1]}")
        return message

    async def _follow(self, worker: _Worker) -> None:
        while True:
            message = await self._next(worker)
            if message[0] == "done":
                worker.summary = message[1]
                return
            self._merge(*message[1:])

    def _merge(
        self,
        phase: str,
        delta: tuple[int, ...],
        last_error: str,
        publish: tuple[bytes, int],
        e2e: tuple[bytes, int],
    ) -> None:
        counters = self.state.counters
        for name, value in zip(COUNTERS, delta, strict=True):
            setattr(counters, name, getattr(counters, name) + value)
        if last_error:
            counters.last_error = last_error
        if phase == MEASURED:
            self.window_published += delta[0]
            self.window_consumed += delta[4]
        _add(publish, self.state.publish_latency, self.window_publish_latency, phase == MEASURED)
        _add(e2e, self.state.e2e_latency, self.window_e2e_latency, phase != WARMUP)

    def summaries(self) -> list[dict[str, Any]]:
        return [
            worker.summary or {"role": worker.plan.role, "pid": worker.process.pid}
            for worker in self.workers
        ]

    def window_cpu_s(self) -> float:
        return sum(float(s.get("window_cpu_s", 0.0)) for s in self.summaries())

    def close(self) -> None:
        """Stop and reap every process (terminate those still running)."""
        loop = asyncio.get_running_loop()
        for worker in self.workers:
            loop.remove_reader(worker.conn.fileno())
            worker.process.join(STOP_TIMEOUT_S if worker.summary else 0)
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(STOP_TIMEOUT_S)
            worker.conn.close()


def _add(encoded: tuple[bytes, int], live: Latency, window: Latency, in_window: bool) -> None:
    data, sum_us = encoded
    if data:
        histogram = HdrHistogram.decode(data)
        live.add(histogram, sum_us)
        if in_window:
            window.add(histogram, sum_us)


def _drain_pipe(worker: _Worker) -> None:
    """The pipe is readable: queue every whole message; None at its end."""
    try:
        while worker.conn.poll():
            worker.inbox.put_nowait(worker.conn.recv())
    except (EOFError, OSError):
        asyncio.get_running_loop().remove_reader(worker.conn.fileno())
        worker.inbox.put_nowait(None)

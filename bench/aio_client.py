"""The asyncio client (tide.client.aio) against the sync one, in the same run (issue 23;
docs/client.md "The asyncio client", docs/benchmarks.md).

    python -m bench.aio_client                              # 4 rounds of 2 x 2 x 8 s
    python -m bench.aio_client --duration-s 2 --rounds 1    # a smoke run

Starts one cluster of real processes on a fresh store (a name server, one broker:
storage + dispatch, a gateway; bench/tls_cost.py's) with a topic of 4 queues, then
alternates the two clients for ``--rounds`` rounds (sync first in odd rounds, asyncio
first in even ones: the shared box's drift falls on both alike), each phase
``--duration-s``:

* ``produce``: single sends of ``--size`` bytes through the producer's accumulation
  (``send_async`` in a loop: the sync Producer's futures, the asyncio one's deliveries;
  the default linger, batch and in-flight settings of both, ``--max-in-flight`` sends
  unfinished at most), one producer per phase; counts the sends answered.
* ``consume``: PullConsumer pulls of up to 32 messages from offset 0 on, one puller per
  queue (a thread each for the sync client, a task each for the asyncio one), over what
  the produce phases stored; counts the messages received.

Reports messages/s per phase (median over the rounds) and ``aio / sync``; results also go
to ``bench/results/aio_client.json`` with the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from contextlib import ExitStack
from pathlib import Path

from bench._secure import start_cluster
from bench.gateway_produce_pull import loadavg
from tide.client import Admin, MessageQueue, PullConsumer, PullStatus, SendResult
from tide.client import Producer as SyncProducer
from tide.client.aio import Delivery
from tide.client.aio import Producer as AioProducer
from tide.client.aio import PullConsumer as AioPullConsumer

TOPIC = "BenchAio"
GROUP = "BenchAioGroup"
QUEUES = 4
PULL_MAX = 32
RESULTS = Path(__file__).parent / "results" / "aio_client.json"
CLIENTS = ("sync", "aio")


def sync_produce(gateway: str, body: bytes, duration_s: float, max_in_flight: int) -> float:
    sent = 0
    with SyncProducer(gateway, max_in_flight=max_in_flight) as producer:
        pending: deque[Future[SendResult]] = deque()
        started = time.monotonic()
        while time.monotonic() - started < duration_s:
            pending.append(producer.send_async(TOPIC, body))
            while pending and pending[0].done():
                sent += pending.popleft().result().written
        for future in pending:
            sent += future.result().written
        elapsed = time.monotonic() - started
    return sent / elapsed


async def aio_produce(gateway: str, body: bytes, duration_s: float, max_in_flight: int) -> float:
    sent = 0
    async with AioProducer(gateway, max_in_flight=max_in_flight) as producer:
        pending: deque[Delivery] = deque()
        started = time.monotonic()
        while time.monotonic() - started < duration_s:
            pending.append(await producer.send_async(TOPIC, body))
            while pending and pending[0].done():
                sent += pending.popleft().result().written
        for delivery in pending:
            sent += (await delivery).written
        elapsed = time.monotonic() - started
    return sent / elapsed


def sync_consume(gateway: str, duration_s: float) -> float:
    counts = [0] * QUEUES
    with PullConsumer(GROUP, gateway) as consumer:
        queues = consumer.queues(TOPIC)
        started = time.monotonic()

        def pull(index: int, queue: MessageQueue) -> None:
            offset = 0
            while time.monotonic() - started < duration_s:
                result = consumer.pull(queue, offset, PULL_MAX)
                counts[index] += len(result.messages)
                offset = 0 if result.status is PullStatus.NO_NEW_MESSAGE else result.next_offset

        threads = [threading.Thread(target=pull, args=(i, q)) for i, q in enumerate(queues)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
    return sum(counts) / elapsed


async def aio_consume(gateway: str, duration_s: float) -> float:
    async with AioPullConsumer(GROUP, gateway) as consumer:
        queues = await consumer.queues(TOPIC)
        started = time.monotonic()

        async def pull(queue: MessageQueue) -> int:
            count, offset = 0, 0
            while time.monotonic() - started < duration_s:
                result = await consumer.pull(queue, offset, PULL_MAX)
                count += len(result.messages)
                offset = 0 if result.status is PullStatus.NO_NEW_MESSAGE else result.next_offset
            return count

        counts = await asyncio.gather(*(pull(q) for q in queues))
        elapsed = time.monotonic() - started
    return sum(counts) / elapsed


def phase(client: str, kind: str, gateway: str, args: argparse.Namespace) -> float:
    body = b"x" * args.size
    if kind == "produce":
        if client == "sync":
            return sync_produce(gateway, body, args.duration_s, args.max_in_flight)
        return asyncio.run(aio_produce(gateway, body, args.duration_s, args.max_in_flight))
    if client == "sync":
        return sync_consume(gateway, args.duration_s)
    return asyncio.run(aio_consume(gateway, args.duration_s))


def run(gateway: str, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    rates: dict[str, dict[str, list[float]]] = {
        kind: {c: [] for c in CLIENTS} for kind in ("produce", "consume")
    }
    for client in CLIENTS:  # warm-up: channels, imports, the store's first segment
        phase(client, "produce", gateway, argparse.Namespace(**{**vars(args), "duration_s": 1}))
    for round_no in range(args.rounds):
        order = CLIENTS if round_no % 2 == 0 else CLIENTS[::-1]
        for kind in ("produce", "consume"):
            for client in order:
                rate = phase(client, kind, gateway, args)
                rates[kind][client].append(rate)
                print(f"round {round_no + 1} {kind} {client}: {rate:,.0f} msg/s", flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=4, choices=range(1, 11))
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--max-in-flight", type=int, default=256)  # both clients' default
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-aio-bench-"))
    load_before = loadavg()
    try:
        with ExitStack() as stack:
            started = start_cluster(
                stack, root / "cluster", tls=None, secure=False, gateways={"plain": False}
            )
            gateway = started["plain"].address
            with Admin(gateway) as admin:
                admin.create_topic(TOPIC, read_queue_nums=QUEUES)
            rates = run(gateway, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {
        kind: {client: statistics.median(values) for client, values in by_client.items()}
        for kind, by_client in rates.items()
    }
    summary = {
        "args": vars(args),
        "rates_msg_s": rates,
        "median_msg_s": medians,
        "aio_over_sync": {kind: m["aio"] / m["sync"] for kind, m in medians.items()},
        "loadavg": {"before": load_before, "after": loadavg()},
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

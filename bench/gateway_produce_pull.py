"""Gateway benchmark: produce, pull and end-to-end latency through ``tide.v1.Gateway``.

    python -m bench.gateway_produce_pull                      # ~40 s
    python -m bench.gateway_produce_pull --duration-s 5 --inflight 4

Starts real processes on a fresh store: a name server, one broker (storage + dispatch,
registered) and a gateway, and creates a topic with ``--queues`` queues. Then:

* ``produce``: 128-byte messages in batches of 100 (round robin), ``--inflight`` calls
  in flight, for ``--duration-s``: messages/s, and p50/p99 of a call's latency;
* ``pull``: every message read back (one puller per queue, ``--pull-batch`` messages a
  call, no long polling): messages/s;
* ``e2e``: a steady ``--rate`` messages/s (batches of 100) while one long-polling
  consumer per queue follows: p50/p99 from the send of a message's batch to its
  consumer receiving it.

Results go to stdout and ``bench/results/gateway_produce_pull.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import grpc

from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc

RESULTS = Path(__file__).resolve().parent / "results" / "gateway_produce_pull.json"
READY_TIMEOUT_S = 60.0
TOPIC = "BenchGateway"
BROKER = "broker-a"
BATCH = 100
BODY_BYTES = 128
MAX_MESSAGES_PER_PHASE = 50_000_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def service(name: str, args: list[str], run_dir: Path) -> Iterator[str]:
    ready = run_dir / f"{name}.ready"
    log = (run_dir / f"{name}.log").open("wb")
    cmd = [sys.executable, "-m", f"services.{name}", *args, "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    proc = subprocess.Popen(cmd, env={**env, "TIDE_READY_FILE": str(ready)}, stderr=log)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start (exit {proc.poll()}); see {log.name}")
            time.sleep(0.05)
        yield str(json.loads(ready.read_text())["listen"])
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def batch_request(body: bytes) -> pb.ProduceRequest:
    return pb.ProduceRequest(messages=[pb.ProduceMessage(topic=TOPIC, body=body)] * BATCH)


async def produce_phase(
    stub: pb_grpc.GatewayAsyncStub, inflight: int, duration_s: float
) -> dict[str, float]:
    request = batch_request(b"p" * BODY_BYTES)
    latencies_s: list[float] = []
    start = time.monotonic()

    async def caller() -> None:
        while (
            time.monotonic() - start < duration_s
            and len(latencies_s) * BATCH < MAX_MESSAGES_PER_PHASE
        ):
            sent = time.monotonic()
            reply = await stub.Produce(request, timeout=30)
            latencies_s.append(time.monotonic() - sent)
            assert all(r.status == pb.ProduceResult.SEND_OK for r in reply.results)

    await asyncio.gather(*(caller() for _ in range(inflight)))
    wall_s = time.monotonic() - start
    return {
        "msgs_per_s": len(latencies_s) * BATCH / wall_s,
        "calls": len(latencies_s),
        "p50_ms": percentile(latencies_s, 0.5) * 1000,
        "p99_ms": percentile(latencies_s, 0.99) * 1000,
    }


async def pull_phase(
    stub: pb_grpc.GatewayAsyncStub, queues: int, pull_batch: int
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
                ),
                timeout=30,
            )
            if answer.status == pb.PullResponse.NO_NEW_MESSAGE:
                return
            totals[queue_id] += len(answer.messages)
            offset = answer.next_offset

    await asyncio.gather(*(puller(q) for q in range(queues)))
    wall_s = time.monotonic() - start
    return {"msgs_per_s": sum(totals) / wall_s, "messages": sum(totals)}


async def e2e_phase(
    stub: pb_grpc.GatewayAsyncStub, queues: int, rate: int, duration_s: float
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
                ),
                timeout=30,
            )
            now_ns = time.time_ns()
            for message in answer.messages:
                latencies_s.append((now_ns - int(message.body[:20])) / 1e9)
            offset = answer.next_offset
            if len(latencies_s) >= expected:
                done.set()

    consumers = [asyncio.ensure_future(consumer(q)) for q in range(queues)]
    await asyncio.sleep(0.5)  # the consumers are held
    interval_s = BATCH / rate
    start = time.monotonic()
    for index in range(expected // BATCH):
        await asyncio.sleep(max(0.0, start + index * interval_s - time.monotonic()))
        body = str(time.time_ns()).rjust(20, "0").encode().ljust(BODY_BYTES, b" ")
        await stub.Produce(batch_request(body), timeout=30)
    try:
        await asyncio.wait_for(done.wait(), timeout=60)
    finally:
        for task in consumers:
            task.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
    return {
        "rate_msgs_per_s": rate,
        "messages": len(latencies_s),
        "p50_ms": percentile(latencies_s, 0.5) * 1000,
        "p99_ms": percentile(latencies_s, 0.99) * 1000,
    }


async def run(gateway: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = pb_grpc.GatewayStub(channel)
        await stub.CreateTopic(
            pb.CreateTopicRequest(
                topic=TOPIC, read_queue_nums=args.queues, write_queue_nums=args.queues
            ),
            timeout=30,
        )
        produce = await produce_phase(stub, args.inflight, args.duration_s)
        await asyncio.sleep(2.0)  # let dispatch catch up
        pull = await pull_phase(stub, args.queues, args.pull_batch)
        e2e = await e2e_phase(stub, args.queues, args.rate, args.duration_s)
    return {"produce": produce, "pull": pull, "e2e": e2e}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=10.0, help="produce phase length")
    parser.add_argument("--inflight", type=int, default=8, help="produce calls in flight")
    parser.add_argument("--queues", type=int, default=4, help="queues of the topic")
    parser.add_argument("--pull-batch", type=int, default=32, help="messages per Pull")
    parser.add_argument("--rate", type=int, default=5_000, help="e2e phase messages/s")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-gateway-bench-"))
    try:
        with ExitStack() as stack:
            namesrv = stack.enter_context(service("nameserver", ["--listen", "127.0.0.1:0"], root))
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
                )
            )
            gateway = stack.enter_context(
                service("gateway", ["--listen", "127.0.0.1:0", "--namesrv", namesrv], root)
            )
            results = asyncio.run(run(gateway, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    produce, pull, e2e = results["produce"], results["pull"], results["e2e"]
    print(
        f"produce: {produce['msgs_per_s']:,.0f} msgs/s ({BODY_BYTES} B, batches of {BATCH}, "
        f"{args.inflight} in flight); call p50 {produce['p50_ms']:.1f} ms, "
        f"p99 {produce['p99_ms']:.1f} ms"
    )
    print(
        f"pull: {pull['msgs_per_s']:,.0f} msgs/s ({args.pull_batch} per call, {args.queues} queues)"
    )
    print(
        f"e2e at {args.rate:,} msgs/s: send -> long-polling consumer p50 {e2e['p50_ms']:.1f} ms, "
        f"p99 {e2e['p99_ms']:.1f} ms ({e2e['messages']:,.0f} messages)"
    )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "args": vars(args),
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                **results,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()

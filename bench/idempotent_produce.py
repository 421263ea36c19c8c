"""Idempotent produce against plain produce, in the same run (issue 19).

    python -m bench.idempotent_produce                    # 3 rounds of 3 x 10 s
    python -m bench.idempotent_produce --duration-s 3 --rounds 1   # a smoke run

Starts real processes on a fresh store (a name server, one broker: storage + dispatch,
and a gateway), creates a topic with ``--queues`` queues, then alternates three phases
for ``--rounds`` rounds (ABC, then CBA, ... so that drift of the shared box falls on each
alike), each for ``--duration-s``, one call in flight per queue (an idempotent producer
has one batch of a queue in flight at a time: its sequences must arrive in order), 100
messages of 128 bytes per call:

* ``plain``: ``Produce`` without a queue (the gateway's plain path, round robin);
* ``plain_queue``: ``Produce`` naming the queue (the general path);
* ``idempotent``: ``Produce`` with ``producer_id`` (one per queue), ``first_sequence``
  and the queue (produce_idempotent.py; the storage checks the window under its lock).

Reports messages/s per phase (the median over the rounds) and ``idempotent / plain`` and
``idempotent / plain_queue``, and each process's CPU microseconds per message per phase
(``cpu_us_per_msg``: where a phase's cost is); results also go to
``bench/results/idempotent_produce.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import grpc

from bench.gateway_produce_pull import cpu_snapshot, free_port, loadavg, service
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc

BROKER = "broker-a"
TOPIC = "BenchIdem"
BATCH = 100
BODY = b"x" * 128
PHASES = ("plain", "plain_queue", "idempotent")
RESULTS = Path(__file__).parent / "results" / "idempotent_produce.json"
CALL_TIMEOUT_S = 30.0


def request(phase: str, queue_id: int, sequence: int) -> pb.ProduceRequest:
    if phase == "plain":
        return pb.ProduceRequest(
            messages=[pb.ProduceMessage(topic=TOPIC, body=BODY)] * BATCH, compact_results=True
        )
    ref = pb.QueueRef(broker_name=BROKER, queue_id=queue_id)
    messages = [pb.ProduceMessage(topic=TOPIC, body=BODY, queue=ref)] * BATCH
    produce = pb.ProduceRequest(messages=messages, compact_results=True)
    if phase == "idempotent":
        produce.producer_id = f"bench-{queue_id}"
        produce.first_sequence = sequence
    return produce


async def phase_rate(
    stub: pb_grpc.GatewayAsyncStub,
    phase: str,
    queues: int,
    duration_s: float,
    next_seq: list[int],
) -> float:
    """Messages/s of ``phase`` with one call in flight per queue for ``duration_s``."""
    deadline = time.monotonic() + duration_s
    sent = [0] * queues

    async def worker(queue_id: int) -> None:
        while time.monotonic() < deadline:
            reply = await stub.Produce(
                request(phase, queue_id, next_seq[queue_id]), timeout=CALL_TIMEOUT_S
            )
            assert len(reply.runs) >= 1 and not reply.duplicate, reply
            if phase == "idempotent":
                next_seq[queue_id] += BATCH
            sent[queue_id] += BATCH

    started = time.monotonic()
    await asyncio.gather(*(worker(q) for q in range(queues)))
    return sum(sent) / (time.monotonic() - started)


# Per phase and process (and the bench client): CPU microseconds per message, summed
# over the rounds, to tell where a phase's cost is.
CPU_US: dict[str, dict[str, float]] = {}
SENT: dict[str, float] = {}


async def run(gateway: str, args: argparse.Namespace) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {phase: [] for phase in PHASES}
    next_seq = [0] * args.queues
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = pb_grpc.GatewayStub(channel)
        await stub.CreateTopic(
            pb.CreateTopicRequest(
                topic=TOPIC, read_queue_nums=args.queues, write_queue_nums=args.queues
            ),
            timeout=CALL_TIMEOUT_S,
        )
        await phase_rate(stub, "plain", args.queues, 2.0, next_seq)  # warm up
        for round_index in range(args.rounds):
            order = PHASES if round_index % 2 == 0 else tuple(reversed(PHASES))
            for phase in order:
                cpu_before, started = cpu_snapshot(), time.monotonic()
                rate = await phase_rate(stub, phase, args.queues, args.duration_s, next_seq)
                cpu_after = cpu_snapshot()
                SENT[phase] = SENT.get(phase, 0) + rate * (time.monotonic() - started)
                spent = CPU_US.setdefault(phase, {})
                for name, seconds in cpu_after.items():
                    spent[name] = spent.get(name, 0) + (seconds - cpu_before[name]) * 1e6
                rates[phase].append(rate)
                print(f"round {round_index + 1} {phase}: {rate:,.0f} msg/s", flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3, choices=range(1, 11))
    parser.add_argument("--queues", type=int, default=4, choices=range(1, 65))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-idem-bench-"))
    load_before = loadavg()
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
            rates = asyncio.run(run(gateway, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {phase: statistics.median(values) for phase, values in rates.items()}
    summary = {
        "args": vars(args),
        "rates_msg_s": rates,
        "median_msg_s": medians,
        "idempotent_over_plain": medians["idempotent"] / medians["plain"],
        "idempotent_over_plain_queue": medians["idempotent"] / medians["plain_queue"],
        "cpu_us_per_msg": {
            phase: {name: round(us / SENT[phase], 2) for name, us in spent.items()}
            for phase, spent in CPU_US.items()
        },
        "loadavg": {"before": load_before, "after": loadavg()},
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

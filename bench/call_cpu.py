"""CPU of each process per client call: small Produce calls and Pulls, one at a time.

    python -m bench.call_cpu                       # ~1 min
    python -m bench.call_cpu --calls 500 --rounds 5

Starts real processes on a fresh store (a name server, one storage + dispatch, a
gateway; bench/gateway_produce_pull.py's ``service``), creates a topic of one queue and
makes ``--calls`` calls back to back of each shape, one in flight, ``--rounds`` times in
turn:

* ``produce-1``: a Produce of one 1 KiB message;
* ``produce-16``: a Produce of 16 messages of 1 KiB;
* ``pull-16``: a Pull of up to 16 messages (ENCODING_RECORDS) walking the queue written
  by the produces (from offset 0, wrapping around to 0 at its end).

For each shape: the CPU each process spent (``/proc/PID/stat``, the client's
``getrusage``) per call, in microseconds, the median over the rounds, and the calls a
second. One call in flight isolates what a call costs: with many in flight the gateway
coalesces appends, so these are the per-call costs concurrency does not share. To
compare two versions of the code, run this from outside the worktree with
``PYTHONPATH`` naming each version in turn (the services inherit it)::

    cd /tmp && PYTHONPATH=$VERSION python -m bench.call_cpu

``--py-spy DIR --py-spy-shape SHAPE`` records each service with py-spy (raw collapsed
stacks, ``DIR/<service>.txt``) during the first round of that shape.

``--cluster-secret-file PATH`` runs every service with that cluster secret (the links
between them carry it: docs/security.md).

``/proc/loadavg`` before and after is printed; the box may be shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path

import grpc

from bench.gateway_produce_pull import (
    BROKER,
    cpu_snapshot,
    free_port,
    loadavg,
    py_spy,
    service,
    settle,
)
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc

TOPIC = "BenchCallCpu"
BODY_BYTES = 1024
PULL_MESSAGES = 16
MAX_CALLS = 100_000
MAX_ROUNDS = 20
SHAPES = ("produce-1", "produce-16", "pull-16")


def produce_request(count: int) -> bytes:
    message = pb.ProduceMessage(topic=TOPIC, body=b"c" * BODY_BYTES)
    return pb.ProduceRequest(messages=[message] * count).SerializeToString()


def produce_caller(channel: grpc.aio.Channel, count: int) -> Callable[[], Awaitable[None]]:
    produce = channel.unary_unary(
        "/tide.v1.Gateway/Produce",
        request_serializer=None,
        response_deserializer=pb.ProduceResponse.FromString,
    )
    request = produce_request(count)

    async def call() -> None:
        answer = await produce(request, timeout=30)
        if len(answer.results) != count:
            raise RuntimeError(f"produce answered {len(answer.results)} results, not {count}")

    return call


def pull_caller(stub: pb_grpc.GatewayAsyncStub) -> Callable[[], Awaitable[None]]:
    offset = 0

    async def call() -> None:
        nonlocal offset
        answer = await stub.Pull(
            pb.PullRequest(
                consumer_group="bench-call-cpu",
                topic=TOPIC,
                broker_name=BROKER,
                queue_id=0,
                offset=offset,
                max_messages=PULL_MESSAGES,
                encoding=pb.PullRequest.ENCODING_RECORDS,
            ),
            timeout=30,
        )
        found = answer.status == pb.PullResponse.FOUND
        offset = answer.next_offset if found else 0

    return call


async def per_call_us(call: Callable[[], Awaitable[None]], calls: int) -> dict[str, float]:
    """CPU microseconds of each process per call, and calls/s, over ``calls`` calls."""
    before, started = cpu_snapshot(), time.monotonic()
    for _ in range(calls):
        await call()
    wall_s = time.monotonic() - started
    after = cpu_snapshot()
    figures = {name: (after[name] - before[name]) / calls * 1e6 for name in after}
    figures["calls_per_s"] = calls / wall_s
    return figures


async def run(
    gateway: str, calls: int, rounds: int, profile: Path | None, profile_shape: str
) -> dict[str, dict[str, float]]:
    samples: dict[str, list[dict[str, float]]] = {shape: [] for shape in SHAPES}
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = pb_grpc.GatewayStub(channel)
        await stub.CreateTopic(
            pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=1, write_queue_nums=1), timeout=30
        )
        callers = {
            "produce-1": produce_caller(channel, 1),
            "produce-16": produce_caller(channel, 16),
            "pull-16": pull_caller(stub),
        }
        for call in callers.values():  # warm up every path (channels, streams, caches)
            for _ in range(20):
                await call()
        await asyncio.to_thread(settle)
        for _ in range(rounds):
            for shape, call in callers.items():
                with py_spy(profile if shape == profile_shape else None):
                    samples[shape].append(await per_call_us(call, calls))
                profile = None if shape == profile_shape else profile  # the first round only
    return {
        shape: {name: round(statistics.median(s[name] for s in runs), 1) for name in runs[0]}
        for shape, runs in samples.items()
    }


def run_cluster(
    calls: int,
    rounds: int,
    profile: Path | None = None,
    profile_shape: str = SHAPES[0],
    cluster_secret_file: Path | None = None,
) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="tide-call-cpu-"))
    load_before = loadavg()
    # every service with the cluster secret, when given (docs/security.md)
    secret = ["--cluster-secret-file", str(cluster_secret_file)] if cluster_secret_file else []
    try:
        with ExitStack() as stack:
            namesrv_args = ["--listen", "127.0.0.1:0", *secret]
            namesrv = stack.enter_context(service("nameserver", namesrv_args, root))
            storage_port, dispatch_port = free_port(), free_port()
            store = str(root / "store")
            storage, dispatch = f"127.0.0.1:{storage_port}", f"127.0.0.1:{dispatch_port}"
            storage_args = ["--listen", storage, "--store-dir", store, "--namesrv", namesrv]
            storage_args += ["--broker-name", BROKER, "--dispatch-address", dispatch, *secret]
            stack.enter_context(service("storage", storage_args, root))
            dispatch_args = ["--listen", dispatch, "--store-dir", store, "--storage", storage]
            dispatch_args += secret
            stack.enter_context(service("dispatch", dispatch_args, root))
            gateway_args = ["--listen", "127.0.0.1:0", "--namesrv", namesrv, *secret]
            gateway = stack.enter_context(service("gateway", gateway_args, root))
            shapes = asyncio.run(run(gateway, calls, rounds, profile, profile_shape))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"us_per_call": shapes, "loadavg": {"before": load_before, "after": loadavg()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per shape and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--py-spy", type=Path, help="py-spy record the services into DIR (first round)"
    )
    parser.add_argument("--py-spy-shape", choices=SHAPES, default=SHAPES[0])
    parser.add_argument(
        "--cluster-secret-file",
        type=Path,
        help="run every service with this cluster secret (docs/security.md)",
    )
    args = parser.parse_args()
    if not 1 <= args.calls <= MAX_CALLS:
        parser.error(f"--calls must be 1..{MAX_CALLS}")
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds must be 1..{MAX_ROUNDS}")
    result = run_cluster(
        args.calls, args.rounds, args.py_spy, args.py_spy_shape, args.cluster_secret_file
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""TLS against plaintext, in the same run (issue 22; docs/security.md, docs/benchmarks.md).

    python -m bench.tls_cost                         # 4 rounds of 2 x 10 s
    python -m bench.tls_cost --duration-s 3 --rounds 1   # a smoke run

Starts two clusters of real processes side by side on fresh stores (each a name server,
one broker: storage + dispatch, and a gateway): ``plain`` with no TLS, ``tls`` with every
service on TLS (certificates made here by tide.certs, mutual TLS between the services:
the gateway -> storage Append goes over mTLS too) and the client on TLS to the gateway.
Then alternates the two for ``--rounds`` rounds (AB, BA, ...: drift of the shared box
falls on both alike), each for ``--duration-s``: ``Produce`` calls of 100 messages of
128 bytes, ``--in-flight`` calls at once on one channel.

Reports messages/s per phase (median over the rounds) and ``tls / plain``; results also
go to ``bench/results/tls_cost.json`` with the load average before and after.
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

from bench.gateway_produce_pull import free_port, loadavg, service
from tide.certs import make_ca, make_leaf
from tide.tls import TlsFiles, channel_credentials
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc

BROKER = "broker-a"
TOPIC = "BenchTls"
BATCH = 100
BODY = b"x" * 128
PHASES = ("plain", "tls")
RESULTS = Path(__file__).parent / "results" / "tls_cost.json"
CALL_TIMEOUT_S = 30.0
QUEUES = 4


def tls_args(files: TlsFiles | None) -> list[str]:
    if files is None:
        return []
    assert files.cert_file and files.key_file and files.ca_file
    return [
        "--tls-cert-file",
        files.cert_file,
        "--tls-key-file",
        files.key_file,
        "--tls-ca-file",
        files.ca_file,
    ]


def start_cluster(stack: ExitStack, root: Path, files: TlsFiles | None) -> str:
    """A name server, storage + dispatch and a gateway under ``root``; the gateway."""
    root.mkdir(parents=True)
    extra = tls_args(files)
    namesrv = stack.enter_context(service("nameserver", ["--listen", "127.0.0.1:0", *extra], root))
    storage_port, dispatch_port = free_port(), free_port()
    store = root / "store"
    storage = [
        "--listen", f"127.0.0.1:{storage_port}", "--store-dir", str(store), "--namesrv",
        namesrv, "--broker-name", BROKER, "--dispatch-address", f"127.0.0.1:{dispatch_port}",
    ]  # fmt: skip
    stack.enter_context(service("storage", [*storage, *extra], root))
    dispatch = [
        "--listen", f"127.0.0.1:{dispatch_port}", "--store-dir", str(store), "--storage",
        f"127.0.0.1:{storage_port}",
    ]  # fmt: skip
    stack.enter_context(service("dispatch", [*dispatch, *extra], root))
    gateway_args = ["--listen", "127.0.0.1:0", "--namesrv", namesrv, *extra]
    return stack.enter_context(service("gateway", gateway_args, root))


def open_channel(gateway: str, files: TlsFiles | None) -> grpc.aio.Channel:
    if files is None:
        return grpc.aio.insecure_channel(gateway)
    credentials = channel_credentials(TlsFiles(ca_file=files.ca_file))
    return grpc.aio.secure_channel(gateway, credentials)


async def phase_rate(stub: pb_grpc.GatewayAsyncStub, in_flight: int, duration_s: float) -> float:
    """Messages/s with ``in_flight`` Produce calls at once for ``duration_s``."""
    request = pb.ProduceRequest(
        messages=[pb.ProduceMessage(topic=TOPIC, body=BODY)] * BATCH, compact_results=True
    )
    deadline = time.monotonic() + duration_s
    sent = [0] * in_flight

    async def worker(index: int) -> None:
        while time.monotonic() < deadline:
            reply = await stub.Produce(request, timeout=CALL_TIMEOUT_S)
            assert len(reply.runs) >= 1, reply
            sent[index] += BATCH

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(in_flight)))
    return sum(sent) / (time.monotonic() - started)


async def run(
    gateways: dict[str, tuple[str, TlsFiles | None]], args: argparse.Namespace
) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {phase: [] for phase in PHASES}
    stubs: dict[str, pb_grpc.GatewayAsyncStub] = {}
    channels = []
    for phase, (gateway, files) in gateways.items():
        channel = open_channel(gateway, files)
        channels.append(channel)
        stubs[phase] = pb_grpc.GatewayStub(channel)
        await stubs[phase].CreateTopic(
            pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES),
            timeout=CALL_TIMEOUT_S,
        )
        await phase_rate(stubs[phase], args.in_flight, 2.0)  # warm up (and the route)
    try:
        for round_index in range(args.rounds):
            order = PHASES if round_index % 2 == 0 else tuple(reversed(PHASES))
            for phase in order:
                rate = await phase_rate(stubs[phase], args.in_flight, args.duration_s)
                rates[phase].append(rate)
                print(f"round {round_index + 1} {phase}: {rate:,.0f} msg/s", flush=True)
    finally:
        for channel in channels:
            await channel.close(None)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=4, choices=range(1, 11))
    parser.add_argument("--in-flight", type=int, default=4, choices=range(1, 65))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-tls-bench-"))
    load_before = loadavg()
    try:
        authority = make_ca(root / "certs")
        leaf = make_leaf(authority, root / "certs", "bench")
        files = TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(leaf.ca_file))
        with ExitStack() as stack:
            gateways = {
                "plain": (start_cluster(stack, root / "plain", None), None),
                "tls": (start_cluster(stack, root / "tls", files), files),
            }
            rates = asyncio.run(run(gateways, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {phase: statistics.median(values) for phase, values in rates.items()}
    summary = {
        "args": vars(args),
        "rates_msg_s": rates,
        "median_msg_s": medians,
        "tls_over_plain": medians["tls"] / medians["plain"],
        "loadavg": {"before": load_before, "after": loadavg()},
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

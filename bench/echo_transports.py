"""CPU of one unary gRPC call on grpcio's servers: ``grpc.aio`` against the thread-pool
``grpc.server``, both serving the same bare ``Storage/Append`` echo (bench/echo_server.py).

    python -m bench.echo_transports                  # ~1 min
    python -m bench.echo_transports --calls 3000 --rounds 5 --in-flight 1 4 16

Both servers run at once (one process each, idle but for their turn); the client is
grpcio's blocking stub, as ``tide.client``'s Producer uses, with ``--in-flight`` threads
each making calls of one 1 KiB message back to back. The transports take turns, in
alternating order each round; for each (transport, calls in flight) it prints the
medians over the rounds of the server's and the client's CPU per call (``/proc/PID/stat``
and ``getrusage``, microseconds) and the calls a second. The gateway's client-facing
calls are grpc.aio's: this says what the other server would cost per call.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack

import grpc

from tide.bench._run import loadavg, process_cpu_s, server_process
from tide.v1 import storage_pb2 as pb

TRANSPORTS = ("aio", "sync")
BODY_BYTES = 1024
MAX_CALLS = 100_000
MAX_ROUNDS = 20
MAX_IN_FLIGHT = 64
SYNC_WORKERS = 16
CALL_TIMEOUT_S = 30.0


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def caller(channel: grpc.Channel) -> Callable[[], None]:
    append = channel.unary_unary(
        "/tide.v1.Storage/Append",
        request_serializer=None,
        response_deserializer=pb.AppendResponse.FromString,
    )
    request = pb.AppendRequest(
        messages=[pb.Message(topic="EchoTransports", body=b"e" * BODY_BYTES)]
    ).SerializeToString()

    def call() -> None:
        if len(append(request, timeout=CALL_TIMEOUT_S).results) != 1:
            raise RuntimeError("the echo answered no result")

    return call


def measure(
    call: Callable[[], None], server_pid: int, calls: int, in_flight: int
) -> dict[str, float]:
    """Per call: the server's and the client's CPU (us), and calls a second."""
    each = max(1, calls // in_flight)

    def calls_in_turn() -> None:
        for _ in range(each):
            call()

    threads = [threading.Thread(target=calls_in_turn) for _ in range(in_flight)]
    server_before, client_before, started = process_cpu_s(server_pid), own_cpu_s(), time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall_s = time.monotonic() - started
    done = each * in_flight
    return {
        "server_us": (process_cpu_s(server_pid) - server_before) / done * 1e6,
        "client_us": (own_cpu_s() - client_before) / done * 1e6,
        "calls_per_s": done / wall_s,
    }


def run(calls: int, rounds: int, in_flights: list[int]) -> dict[str, object]:
    load_before = loadavg()
    samples: dict[str, list[dict[str, float]]] = {}
    with ExitStack() as stack:
        servers = {}
        for transport in TRANSPORTS:
            module = ["bench.echo_server", "--transport", transport, "--workers", str(SYNC_WORKERS)]
            address, process = stack.enter_context(server_process(module, f"{transport} echo"))
            channel = stack.enter_context(grpc.insecure_channel(address))
            servers[transport] = (caller(channel), process.pid)
        for call, _ in servers.values():  # warm up (connections, threads)
            for _ in range(50):
                call()
        for round_index in range(rounds):
            order = TRANSPORTS if round_index % 2 == 0 else TRANSPORTS[::-1]
            for in_flight in in_flights:
                for transport in order:
                    call, pid = servers[transport]
                    key = f"{transport} x{in_flight}"
                    samples.setdefault(key, []).append(measure(call, pid, calls, in_flight))
    medians = {
        key: {name: round(statistics.median(s[name] for s in runs)) for name in runs[0]}
        for key, runs in samples.items()
    }
    return {"per_call": medians, "loadavg": {"before": load_before, "after": loadavg()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 4, 16])
    args = parser.parse_args()
    if not 1 <= args.calls <= MAX_CALLS:
        parser.error(f"--calls must be 1..{MAX_CALLS}")
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds must be 1..{MAX_ROUNDS}")
    if not all(1 <= n <= MAX_IN_FLIGHT for n in args.in_flight):
        parser.error(f"--in-flight must be 1..{MAX_IN_FLIGHT}")
    print(json.dumps(run(args.calls, args.rounds, args.in_flight), indent=1))


if __name__ == "__main__":
    main()

"""A grpc.aio server's CPU per unary call: methods registered by name against generic only.

    python -m bench.server_methods                      # ~1 min
    python -m bench.server_methods --methods 62 --calls 20000 --rounds 3

One server process (uvloop, as the services) serves ``--methods`` echo methods of one
service, either also registered by name (``add_registered_method_handlers``, what a
generated ``add_..._to_server`` does) or as a generic handler only (what
``tide.server`` does since; tide/server/_generic_handlers.py says why). A client
process makes ``--calls`` unary calls of 16 bytes to the first method, 4 in flight,
after 500 to warm up. Printed per round: the server's CPU per call (its
``time.process_time`` over the measured calls) and the calls a second; then the
medians. The two kinds alternate, the order reversed every other round. ``/proc/loadavg``
before and after is printed; the box may be shared.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any

import grpc
import uvloop

from bench.gateway_produce_pull import loadavg

SERVICE = "bench.Methods"
WARMUP_CALLS = 500
IN_FLIGHT = 4
BODY = b"x" * 16
KINDS = ("registered", "generic")


async def _echo(request: bytes, _context: Any) -> bytes:
    return request


def _same(message: bytes) -> bytes:
    return message


async def _client(port: int, calls: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(f"/{SERVICE}/M0", _same, _same)
        slots = asyncio.Semaphore(IN_FLIGHT)

        async def one() -> None:
            async with slots:
                await call(BODY)

        await asyncio.gather(*(one() for _ in range(WARMUP_CALLS)))
        print("warm", flush=True)
        await asyncio.gather(*(one() for _ in range(calls)))
        print("done", flush=True)


async def _round(kind: str, methods: int, calls: int) -> tuple[float, float]:
    """(server CPU us per call, calls per second) of one round."""
    handlers = {
        f"M{i}": grpc.unary_unary_rpc_method_handler(_echo, _same, _same) for i in range(methods)
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    if kind == "registered":
        # not in grpc.aio.Server's typed surface; the generated code calls it
        server.add_registered_method_handlers(SERVICE, handlers)  # type: ignore[attr-defined]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.server_methods", "--client", str(port), "--calls",
        str(calls), stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert client.stdout is not None
        if (await client.stdout.readline()).strip() != b"warm":
            raise RuntimeError("the client process failed while warming up")
        cpu, wall = time.process_time(), time.monotonic()
        if (await client.stdout.readline()).strip() != b"done":
            raise RuntimeError("the client process failed")
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    finally:
        await client.wait()
        await server.stop(None)
    return 1e6 * cpu / calls, calls / wall


async def _main(args: argparse.Namespace) -> None:
    print(f"loadavg before: {loadavg()}")
    results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    for number in range(args.rounds):
        order = KINDS if number % 2 == 0 else KINDS[::-1]
        for kind in order:
            cpu_us, rate = await _round(kind, args.methods, args.calls)
            results[kind].append((cpu_us, rate))
            print(
                f"round {number} {kind:10s} server CPU {cpu_us:6.1f} us/call  {rate:7.0f} calls/s"
            )
    print(f"loadavg after: {loadavg()}")
    for kind in KINDS:
        cpu = statistics.median(value for value, _ in results[kind])
        rate = statistics.median(value for _, value in results[kind])
        print(f"median {kind:10s} ({args.methods} methods) {cpu:6.1f} us/call  {rate:7.0f} calls/s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", type=int, default=62, help="methods of the service")
    parser.add_argument("--calls", type=int, default=20_000, help="measured calls a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 1 <= args.methods <= 1000 or not 1 <= args.calls <= 1_000_000:
        parser.error("--methods must be 1..1000 and --calls 1..1000000")
    if not 1 <= args.rounds <= 100:
        parser.error("--rounds must be 1..100")
    if args.client is not None:
        uvloop.run(_client(args.client, args.calls))
    else:
        uvloop.run(_main(args))


if __name__ == "__main__":
    main()

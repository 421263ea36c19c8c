"""The CPU of one exchange on a stream written one request at a time, with the cluster
secret sent three ways: not at all, as call metadata (``SecretChannel``, what the
services do) and through a client interceptor (how they sent it before).

    python -m bench.secret_channel                     # ~1 min
    python -m bench.secret_channel --exchanges 8000 --rounds 8

One process (uvloop, as the services) runs a grpc.aio server with a bidirectional echo
method (the secret's check runs once a call, not per exchange, so it is left out) and a
client that opens one stream per round and makes ``--exchanges`` exchanges on it
(``write`` one request of 100 bytes, ``read`` its answer: how the gateway's request
streams are used, services/gateway/request_streams.py), after 200 to warm up. Printed:
the process's CPU (client and server together) an exchange for each way in each round,
the ways in turn (the order reversed every other round), then the medians.
``/proc/loadavg`` before and after is printed; the box may be shared.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import uvloop

from bench.gateway_produce_pull import loadavg
from tide.server import _cluster_secret as cluster_secret
from tide.server._cluster_secret import METADATA_KEY, cluster_channel

METHOD = "/bench.SecretEcho/Echo"
SECRET = "bench-cluster-secret-0123456789"
WARMUP_EXCHANGES = 200
BODY = b"x" * 100
WAYS = ("none", "metadata", "interceptor")


def _same(message: bytes) -> bytes:
    return message


async def _echo(
    requests: AsyncIterator[bytes], _context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


class _SecretInterceptor(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    """The secret added by a client interceptor (the services' way before SecretChannel)."""

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(METADATA_KEY, SECRET)
        return await continuation(
            grpc.aio.ClientCallDetails(
                details.method, details.timeout, metadata, details.credentials, None
            ),
            requests,
        )


def _channel(way: str, address: str) -> grpc.aio.Channel:
    if way == "interceptor":
        interceptor: Any = _SecretInterceptor()  # (grpc-stubs' interceptor type is partial)
        return grpc.aio.insecure_channel(address, interceptors=[interceptor])
    channel = grpc.aio.insecure_channel(address)
    return cluster_channel(channel) if way == "metadata" else channel


async def _round(way: str, address: str, exchanges: int) -> float:
    """CPU microseconds of the process an exchange."""
    async with _channel(way, address) as channel:
        call = channel.stream_stream(METHOD, _same, _same)(None)  # written one by one
        for _ in range(WARMUP_EXCHANGES):
            await call.write(BODY)
            await call.read()
        started = time.process_time()
        for _ in range(exchanges):
            await call.write(BODY)
            await call.read()
        spent = time.process_time() - started
        await call.done_writing()
        return 1e6 * spent / exchanges


async def _main(args: argparse.Namespace) -> None:
    print(f"loadavg before: {loadavg()}")
    cluster_secret.SECRET.value = SECRET  # what cluster_channel sends
    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(_echo, _same, _same)
    service, name = METHOD.lstrip("/").rsplit("/", 1)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {name: handler}),)
    )
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    results: dict[str, list[float]] = {way: [] for way in WAYS}
    try:
        for number in range(args.rounds):
            for way in WAYS if number % 2 == 0 else WAYS[::-1]:
                results[way].append(await _round(way, address, args.exchanges))
                print(f"round {number} {way:11s} {results[way][-1]:6.1f} us an exchange")
    finally:
        await server.stop(None)
    print(f"loadavg after: {loadavg()}")
    for way in WAYS:
        print(f"median {way:11s} {statistics.median(results[way]):6.1f} us an exchange")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=8000, help="measured exchanges a round")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    if not 1 <= args.exchanges <= 1_000_000 or not 1 <= args.rounds <= 100:
        parser.error("--exchanges must be 1..1000000 and --rounds 1..100")
    uvloop.run(_main(args))


if __name__ == "__main__":
    main()

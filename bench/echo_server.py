"""A bare ``tide.v1.Storage/Append`` echo: the same request and response shapes as the
storage service, no storage. ``python -m bench.echo_server READY_FILE`` serves on a free
port on 127.0.0.1 and writes ``{"listen": ...}`` to READY_FILE. The benchmark's baseline:
what Python gRPC itself carries on this machine.

``--transport aio`` (the default) serves on ``grpc.aio`` as Tide's services do;
``--transport sync`` on grpcio's thread-pool ``grpc.server`` (``--workers`` threads),
so bench/echo_transports.py can compare what a call costs each server."""

from __future__ import annotations

import argparse
import json
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tide.format import make_msg_id
from tide.server import EVENT_LOOPS, run_on
from tide.v1 import storage_pb2 as pb

PREFIX = "7F00000100002A9F"


TRANSPORTS = ("aio", "sync")
MAX_WORKERS = 64


def answer(request: pb.AppendRequest) -> pb.AppendResponse:
    response = pb.AppendResponse()
    add = response.results.add
    for index, msg in enumerate(request.messages):
        offset = index * (91 + len(msg.body))
        add(
            msg_id=make_msg_id(PREFIX, offset),
            physical_offset=offset,
            queue_offset=index,
            store_timestamp_ms=1,
            size=91 + len(msg.body),
        )
    return response


async def append(
    request: pb.AppendRequest, context: grpc.aio.ServicerContext[object, object]
) -> pb.AppendResponse:
    return answer(request)


def _handlers(behaviour: object) -> list[grpc.GenericRpcHandler[Any, Any]]:
    handler = grpc.unary_unary_rpc_method_handler(
        behaviour,  # type: ignore[arg-type]  # (an async one for the aio server)
        request_deserializer=pb.AppendRequest.FromString,
        response_serializer=pb.AppendResponse.SerializeToString,
    )
    return [grpc.method_handlers_generic_handler("tide.v1.Storage", {"Append": handler})]


async def serve(ready: Path) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(_handlers(append))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ready.write_text(json.dumps({"listen": f"127.0.0.1:{port}"}))
    await server.wait_for_termination()


def serve_sync(ready: Path, workers: int) -> None:
    """The same echo on grpcio's thread-pool server."""
    pool = futures.ThreadPoolExecutor(max_workers=workers)
    server = grpc.server(pool, maximum_concurrent_rpcs=4 * workers)
    server.add_generic_rpc_handlers(_handlers(lambda request, _context: answer(request)))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ready.write_text(json.dumps({"listen": f"127.0.0.1:{port}"}))
    threading.Event().wait()  # until terminated


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ready_file", type=Path, metavar="READY_FILE")
    parser.add_argument("--transport", choices=TRANSPORTS, default="aio")
    parser.add_argument("--workers", type=int, default=16, help="sync: the pool's threads")
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=EVENT_LOOPS[0],
        help="aio: the event loop (the storage's default, as it runs)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= MAX_WORKERS:
        parser.error(f"--workers must be 1..{MAX_WORKERS}")
    if args.transport == "sync":
        serve_sync(args.ready_file, args.workers)
    else:
        run_on(args.event_loop, serve(args.ready_file))


if __name__ == "__main__":
    main()

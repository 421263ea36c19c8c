"""A bare ``tide.v1.Storage/Append`` echo: the same request and response shapes as the
storage service, no storage. ``python -m bench.echo_server READY_FILE`` serves on a free
port on 127.0.0.1 and writes ``{"listen": ...}`` to READY_FILE. The benchmark's baseline:
what Python gRPC itself carries on this machine."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import grpc

from tide.format import make_msg_id
from tide.v1 import storage_pb2 as pb

PREFIX = "7F00000100002A9F"


async def append(
    request: pb.AppendRequest, context: grpc.aio.ServicerContext[object, object]
) -> pb.AppendResponse:
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


async def serve(ready: Path) -> None:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        append,
        request_deserializer=pb.AppendRequest.FromString,
        response_serializer=pb.AppendResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("tide.v1.Storage", {"Append": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ready.write_text(json.dumps({"listen": f"127.0.0.1:{port}"}))
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ready_file", type=Path, metavar="READY_FILE")
    asyncio.run(serve(parser.parse_args(argv).ready_file))


if __name__ == "__main__":
    main()

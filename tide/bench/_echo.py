"""A bare ``tide.v1.Gateway/Produce`` (and ``ProduceStream``) echo: the gateway's request
and response shapes, no routing, no storage: the ``tide bench`` baseline (what Python gRPC
itself carries here).

``python -m tide.bench._echo [--event-loop LOOP] READY_FILE`` serves on a free port of
127.0.0.1 and writes ``{"listen": "127.0.0.1:PORT"}`` to READY_FILE; it runs on the event
loop Tide's services run on by default (their ``--event-loop``) unless told otherwise.
Each message gets the result a gateway would give (status SEND_OK, an offset message id,
a unique key, broker, queue, offset, store time), built the cheap way (as
``bench/echo_server.py`` does for Storage/Append).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from tide.format import make_msg_id
from tide.server import EVENT_LOOPS, run_on
from tide.v1 import gateway_pb2 as pb

PREFIX = "7F00000100002A9F"
BROKER = "broker-a"
QUEUES = 4
RECORD_OVERHEAD_BYTES = 91


class _Echo:
    def __init__(self) -> None:
        self.offset = 0
        self.queue_offsets = [0] * QUEUES
        self.unique_prefix = os.urandom(8).hex().upper()
        self.counter = 0
        self.calls = 0

    async def produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ProduceResponse:
        """Results as Tide's gateway would shape them: a result per message, or with
        compact_results one run (a batch goes to one queue, the next call the next)."""
        now_ms = time.time_ns() // 1_000_000
        queue_id = self.calls % QUEUES
        self.calls += 1
        first_offset = self.queue_offsets[queue_id]
        physical: list[int] = []
        keys: list[str] = []
        for message in request.messages:
            physical.append(self.offset)
            keys.append(f"{self.unique_prefix}{self.counter:016X}")
            self.offset += RECORD_OVERHEAD_BYTES + len(message.body)
            self.counter += 1
        count = len(keys)
        self.queue_offsets[queue_id] += count
        if request.compact_results:
            run = pb.ProduceRun(
                count=count,
                broker_name=BROKER,
                queue_id=queue_id,
                first_queue_offset=first_offset,
                msg_id_prefix=PREFIX,
                physical_offsets=physical,
                unique_keys=keys,
                store_timestamp_ms=now_ms,
            )
            return pb.ProduceResponse(runs=[run])
        response = pb.ProduceResponse()
        add = response.results.add
        for index, (offset, key) in enumerate(zip(physical, keys, strict=True)):
            add(
                msg_id=make_msg_id(PREFIX, offset),
                unique_key=key,
                broker_name=BROKER,
                queue_id=queue_id,
                queue_offset=first_offset + index,
                store_timestamp_ms=now_ms,
            )
        return response

    async def produce_stream(
        self,
        requests: AsyncIterator[pb.ProduceRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[pb.ProduceStreamResponse]:
        """Each request answered in turn, as ``produce`` answers it."""
        async for request in requests:
            yield pb.ProduceStreamResponse(response=await self.produce(request, context))


async def serve(ready: Path) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 128 << 20),
            ("grpc.max_send_message_length", 128 << 20),
        ]
    )
    echo = _Echo()
    handler = grpc.unary_unary_rpc_method_handler(
        echo.produce,
        request_deserializer=pb.ProduceRequest.FromString,
        response_serializer=pb.ProduceResponse.SerializeToString,
    )
    stream_handler = grpc.stream_stream_rpc_method_handler(
        echo.produce_stream,
        request_deserializer=pb.ProduceRequest.FromString,
        response_serializer=pb.ProduceStreamResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "tide.v1.Gateway", {"Produce": handler, "ProduceStream": stream_handler}
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    write_ready(ready, port)
    await server.wait_for_termination()


def write_ready(ready: Path, port: int) -> None:
    """Tell the parent where a server on 127.0.0.1 listens: ``{"listen": ADDRESS}`` in
    ``ready``, written whole (renamed into place)."""
    partial = ready.with_suffix(".tmp")
    partial.write_text(json.dumps({"listen": f"127.0.0.1:{port}"}))
    partial.rename(ready)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the bare gRPC echo of tide bench's baseline")
    parser.add_argument("--event-loop", choices=EVENT_LOOPS, default=EVENT_LOOPS[0])
    parser.add_argument("ready_file", type=Path)
    args = parser.parse_args(argv)
    run_on(args.event_loop, serve(args.ready_file))


if __name__ == "__main__":
    main()

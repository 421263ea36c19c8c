"""In-process: the gateway's own work for one produce request of target 2's shape (100
messages of 128 B, one topic, ``compact_results``), per message, for the code on
``PYTHONPATH`` (old or new: run it from outside the tree to compare two versions):

    cd /tmp && PYTHONPATH=$VERSION python $THIS_TREE/bench/produce_inproc.py

The request parsed as grpc.aio hands it over, its size, the checks, the unique keys, the
run, the ``AppendRequest`` and the compact answer, as ``Producer.produce`` runs them on
the plain path (the routes, the append call and the event loop left out). Thread CPU,
the best of 7 x 600 requests. Then, for the compact-encoding question
(docs/performance.md): the conversion alone and the check of a run the client would
have laid out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

from services.gateway import produce_plain
from services.gateway.bodies_only import messages_bytes
from services.gateway.produce_plain import PlainBatch, PlainGroup
from services.gateway.produce_results import appended_response
from services.gateway.uniq import UniqueKeyGenerator
from services.gateway.validate import check_produce_messages
from tide.format import RunWriter, scan_run, topic_part
from tide.limits import request_error
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

TOPIC = "bench-topic-0"
MESSAGES = 100
BODY_BYTES = 128
MAX_BODY_BYTES = 4 << 20
REQUESTS = 600
REPEATS = 7


def best_us_per_message(run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        started = time.thread_time()
        for _ in range(REQUESTS):
            run()
        best = min(best, (time.thread_time() - started) / REQUESTS)
    return best / MESSAGES * 1e6


def main() -> None:
    new = hasattr(produce_plain, "bodies_wire")  # the compiled bytes path exists
    message = pb.ProduceMessage(topic=TOPIC, body=os.urandom(BODY_BYTES))
    raw = pb.ProduceRequest(messages=[message] * MESSAGES, compact_results=True)
    wire_in = raw.SerializeToString()
    keys_made = UniqueKeyGenerator()
    magic, part = topic_part(TOPIC.encode())
    view = cast(Any, SimpleNamespace(topic=TOPIC, message_type=None))
    offsets = range(0, MESSAGES * 300, 300)
    appended = storage_pb.AppendResponse.FromString(
        storage_pb.AppendResponse(
            physical_offsets=offsets, queue_offsets=range(MESSAGES), msg_id_prefix="7F00"
        ).SerializeToString()
    )

    def one_request() -> bytes:
        request = pb.ProduceRequest.FromString(wire_in)
        serialized = request.SerializeToString() if new else None  # the stream's size
        size = request.ByteSize() if serialized is None else len(serialized)
        request_error(request)
        messages = request.messages
        wire = produce_plain.bodies_wire(request, MAX_BODY_BYTES, serialized) if new else None
        if wire is None:
            check_produce_messages(messages, MAX_BODY_BYTES, messages_bytes(request, size))
        keys = keys_made.next_many(len(messages))
        plain = PlainBatch(messages, keys, view, bodies_only=True, compact=True)
        if wire is not None:
            plain.wire = wire[1]
        group = PlainGroup(cast(Any, None), RunWriter(bytes(8)), 0)
        plain.encode(group, magic, part, 1)
        storage_pb.AppendRequest(records=[group.writer.getvalue()]).SerializeToString()
        answer = appended_response(keys, ("broker-a", 0, appended, 0))
        return pb.ProduceStreamResponse(response=answer).SerializeToString()

    print(f"{'new' if new else 'old'} code: {best_us_per_message(one_request):.3f} us a message")
    if not new:
        return
    request = pb.ProduceRequest.FromString(wire_in)
    request.messages[0]

    def conversion() -> bytes:
        wire = produce_plain.bodies_wire(request, MAX_BODY_BYTES)
        assert wire is not None
        plain = PlainBatch(request.messages, keys_made.next_many(MESSAGES), view, bodies_only=True)
        plain.wire = wire[1]
        group = PlainGroup(cast(Any, None), RunWriter(bytes(8)), 0)
        plain.encode(group, magic, part, 1)
        return group.writer.getvalue()

    laid_out = storage_pb.AppendRequest(records=[conversion()]).SerializeToString()

    def client_run_checked() -> None:
        scan_run(storage_pb.AppendRequest.FromString(laid_out).records[0], MAX_BODY_BYTES)

    def fields_parsed() -> None:
        pb.ProduceRequest.FromString(wire_in).messages[MESSAGES - 1]

    for what, run in (
        ("the conversion (bytes, scan, keys, run)", conversion),
        ("a client-laid run checked (parse, scan_run)", client_run_checked),
        ("the request's message fields parsed", fields_parsed),
    ):
        print(f"  {what}: {best_us_per_message(run):.3f} us a message")


if __name__ == "__main__":
    main()

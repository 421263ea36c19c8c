"""Produce for an idempotent producer (``ProduceRequest.producer_id``): the batch goes
to its one explicit queue in one ``Storage.Append`` carrying the producer id and first
sequence, which the storage checks under its append lock (a retry is answered with the
original result, nothing written again).

Kept off the common path: the plain produce only tests ``producer_id`` once. The
Append carries the producer fields per record run (``producer_runs``), so it coalesces
with other idempotent producers' appends in the storage's append queue as plain ones do
(append_queue.py); never retried on another broker (the sequences belong to the queue).
Each record carries ``__PID`` and ``__PSEQ`` (docs/formats.md), from which the storage
rebuilds its window after a crash. A message without its own unique key gets one derived
from (producer, queue, sequence), so a retry stores and answers the same one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import grpc

from services.gateway.append_queue import PRODUCER_RUNS, Outcome
from services.gateway.bodies_only import (
    field_bytes,
    messages_bytes,
    only_topic_and_bodies,
    varint_bytes,
)
from services.gateway.brokers import BrokerChannels, broker_error
from services.gateway.produce_results import appended_response, produce_response, written_rows
from services.gateway.produce_routes import explicit_queue
from services.gateway.records import add_message
from services.gateway.routes import Member, QueueRef, RouteCache, TopicView
from services.gateway.scheduled import is_delayed
from tide.format import (
    PRODUCER_EPOCH,
    PRODUCER_ID,
    PRODUCER_SEQ,
    UNIQ_KEY,
    RunWriter,
    format_sequences,
    producer_id_error,
)
from tide.limits import APPEND_MAX_BYTES, limit_text
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb


def _invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def check_idempotent(request: pb.ProduceRequest) -> None:
    """INVALID_ARGUMENT unless the batch is one an idempotent producer may send."""
    error = producer_id_error(request.producer_id)
    if error is not None:
        raise _invalid(f"producer_id {quote(request.producer_id)}: {error}")
    if request.first_sequence < 0:
        raise _invalid(f"first_sequence {request.first_sequence} is negative")
    if request.producer_epoch < 0:
        raise _invalid(f"producer_epoch {request.producer_epoch} is negative")
    first = request.messages[0]
    for index, message in enumerate(request.messages):
        if message.WhichOneof("route") != "queue":
            raise _invalid(
                f"messages[{index}]: an idempotent producer names the queue (sequences are "
                "per producer and queue): set queue from the topic's route"
            )
        if message.topic != first.topic or message.queue != first.queue:
            raise _invalid(
                f"messages[{index}]: an idempotent batch goes to one queue (that of "
                "messages[0]): split the batch by queue"
            )
        if is_delayed(message):
            raise _invalid(f"messages[{index}]: an idempotent producer cannot delay messages")


def bare_idempotent(request: pb.ProduceRequest, request_bytes: int, max_body_bytes: int) -> bool:
    """True when every message is a topic, a body of 1..``max_body_bytes`` bytes and the
    first message's queue, and nothing else (told from sizes, as bodies_only.py does for
    the plain path, plus one look at each message's queue and topic): the batch then skips the
    field-by-field checks and is encoded in one loop. False says nothing more."""
    messages = request.messages
    first = messages[0]
    if (
        first.WhichOneof("route") != "queue"
        or min(request.first_sequence, request.producer_epoch) < 0
    ):
        return False  # negative numbers are refused by check_idempotent
    topic, broker, queue_id = first.topic, first.queue.broker_name, first.queue.queue_id
    for message in messages:
        queue = message.queue
        # The sizes cannot tell another topic of the same length: the bare run would
        # store the message under the first one's.
        if queue.queue_id != queue_id or queue.broker_name != broker or message.topic != topic:
            return False
    return only_topic_and_bodies(
        messages,
        topic,
        messages_bytes(request, request_bytes) - _producer_fields_bytes(request),
        max_body_bytes,
        same_fields_bytes=field_bytes(first.queue.ByteSize()),  # the queue, field 7
    )


_HIGH_FIELD_KEY_BYTES = 2  # the key of a field numbered 16..2047 (the idem range, 90-92)


def _producer_fields_bytes(request: pb.ProduceRequest) -> int:
    """The encoded size of the request's producer fields (producer id, sequence, epoch)."""
    pid = len(request.producer_id.encode())
    size = _HIGH_FIELD_KEY_BYTES + varint_bytes(pid) + pid
    for value in (request.first_sequence, request.producer_epoch):
        if value:
            size += _HIGH_FIELD_KEY_BYTES + varint_bytes(value)
    return size


def derived_unique_keys(request: pb.ProduceRequest, *, bare: bool = False) -> list[str]:
    """Each message's own key, or one derived from (producer, queue, sequence): the
    same on every retry. 32 hex digits, as a UNIQ_KEY is: 16 of a hash of the producer
    and queue (one hash per request), then the sequence's 16. ``bare``: no message has
    a key of its own (:func:`bare_idempotent`), so none is read."""
    messages = request.messages
    first = messages[0]
    where = f"{request.producer_id}/{first.topic}/{first.queue.broker_name}/{first.queue.queue_id}"
    prefix = hashlib.blake2b(where.encode(), digest_size=8).hexdigest().upper()
    seq = request.first_sequence
    if bare:
        return [f"{prefix}{sequence:016X}" for sequence in range(seq, seq + len(messages))]
    return [
        message.unique_key or f"{prefix}{seq + index:016X}"
        for index, message in enumerate(messages)
    ]


def producer_properties(request: pb.ProduceRequest) -> str:
    """``__PID``, ``__PSEQ`` and (when not 0) ``__PEPOCH``, as records carry them."""
    first_seq = request.first_sequence
    last_seq = first_seq + len(request.messages) - 1
    text = (
        f"{PRODUCER_ID}\x01{request.producer_id}\x02"
        f"{PRODUCER_SEQ}\x01{format_sequences(first_seq, last_seq)}\x02"
    )
    if request.producer_epoch:
        text += f"{PRODUCER_EPOCH}\x01{request.producer_epoch}\x02"
    return text


def bare_run(
    request: pb.ProduceRequest,
    queue_id: int,
    unique_keys: Sequence[str],
    born_host: bytes,
    topic_part: tuple[int, bytes],
    now_ms: int,
) -> bytes:
    """The run of a bare batch (:func:`bare_idempotent`) in one loop."""
    extra = producer_properties(request)
    messages = request.messages
    properties = [f"{UNIQ_KEY}\x01{key}\x02{extra}".encode() for key in unique_keys]
    writer = RunWriter(born_host)
    magic, part = topic_part
    bodies = [message.body for message in messages]
    writer.add_many(magic, part, [queue_id] * len(messages), bodies, properties, now_ms)
    return writer.getvalue()


def idempotent_run(
    request: pb.ProduceRequest,
    queue_id: int,
    unique_keys: Sequence[str],
    born_host: bytes,
    now_ms: int,
) -> bytes:
    extra = producer_properties(request).encode()
    writer = RunWriter(born_host)
    for message, unique_key in zip(request.messages, unique_keys, strict=True):
        add_message(writer, message, queue_id, unique_key, now_ms, more_properties=extra)
    return writer.getvalue()


async def produce_idempotent(
    request: pb.ProduceRequest,
    routes: RouteCache,
    channels: BrokerChannels,
    view: TopicView,
    born_host: bytes,
    now_ms: int,
    timeout_s: float,
    bare_topic_part: tuple[int, bytes] | None,
) -> pb.ProduceResponse:
    """``bare_topic_part``: the topic's encoded part when the batch is bare (checked by
    :func:`bare_idempotent`), else None (then checked here message by message)."""
    if bare_topic_part is None:
        check_idempotent(request)
    first = request.messages[0]
    view, queue = await explicit_queue(routes, 0, first, view)
    member = view.master(queue.broker_name)
    if member is None:
        raise ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            f"broker {quote(queue.broker_name)} has no master now: retry the same batch later",
        )
    unique_keys = derived_unique_keys(request, bare=bare_topic_part is not None)
    if bare_topic_part is None:
        run = idempotent_run(request, queue.queue_id, unique_keys, born_host, now_ms)
    else:
        run = bare_run(request, queue.queue_id, unique_keys, born_host, bare_topic_part, now_ms)
    if len(run) > APPEND_MAX_BYTES:  # the producer properties are not in the overhead
        raise _invalid(
            f"the batch's records are {len(run)} bytes with the producer properties, over "
            f"{limit_text('APPEND_MAX_BYTES')}: split the batch"
        )
    count = len(request.messages)
    outcome = await _append(channels, member, queue, run, request, timeout_s)
    response, start = outcome.response, outcome.start
    if outcome.end - start != count or len(response.physical_offsets) < outcome.end:
        raise ServiceError(
            grpc.StatusCode.INTERNAL,
            f"broker {member.broker_name} answered {len(response.physical_offsets)} offsets "
            f"for {count} records",
        )
    if request.compact_results:  # one run, its columns sliced from the Append's answer
        answer = appended_response(
            unique_keys, (member.broker_name, queue.queue_id, response, start)
        )
    else:
        rows = written_rows(member.broker_name, [queue.queue_id] * count, response, start)
        answer = produce_response(unique_keys, rows, [None] * count)
    # Only an Append of this batch alone says duplicate (a coalesced one with a retry
    # among its batches is ABORTED and each sent alone).
    answer.duplicate = response.duplicate
    return answer


async def _append(
    channels: BrokerChannels,
    member: Member,
    queue: QueueRef,
    run: bytes,
    request: pb.ProduceRequest,
    timeout_s: float,
) -> Outcome:
    append = storage_pb.AppendRequest(
        records=[run],
        producer_runs=[
            storage_pb.ProducerRun(
                producer_id=request.producer_id,
                first_sequence=request.first_sequence,
                producer_epoch=request.producer_epoch,
            )
        ],
    )
    try:
        return await channels.appends(member.storage).append(
            append.SerializeToString(), len(request.messages), timeout_s, kind=PRODUCER_RUNS
        )
    except grpc.aio.AioRpcError as exc:
        what = f"idempotent Append to broker {member.broker_name} queue {queue.queue_id}"
        raise broker_error(exc, what) from exc

"""Produce for an idempotent producer (``ProduceRequest.producer_id``): the batch goes
to its one explicit queue in one ``Storage.Append`` carrying the producer id and first
sequence, which the storage checks under its append lock (a retry is answered with the
original result, nothing written again).

Kept off the common path: the plain produce only tests ``producer_id`` once. Not
coalesced with other producers' appends (the append queue concatenates requests, and
these fields are per request), never retried on another broker (the sequences belong
to the queue). Each record carries ``__PID`` and ``__PSEQ`` (docs/formats.md), from which
the storage rebuilds its window after a crash. A message without its own unique key gets
one derived from (producer, queue, sequence), so a retry stores and answers the same one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import grpc

from services.gateway.brokers import BrokerChannels, broker_error
from services.gateway.produce_results import produce_response, runs_response, written_rows
from services.gateway.produce_routes import explicit_queue
from services.gateway.records import message_properties
from services.gateway.routes import Member, QueueRef, RouteCache, TopicView
from services.gateway.scheduled import is_delayed
from tide.format import (
    PRODUCER_EPOCH,
    PRODUCER_ID,
    PRODUCER_SEQ,
    RunWriter,
    format_sequences,
    producer_id_error,
)
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


def derived_unique_keys(request: pb.ProduceRequest) -> list[str]:
    """Each message's own key, or one derived from (producer, queue, sequence): the
    same on every retry (32 hex digits, as a UNIQ_KEY is)."""
    first = request.messages[0]
    where = f"{request.producer_id}/{first.topic}/{first.queue.broker_name}/{first.queue.queue_id}"
    keys: list[str] = []
    for index, message in enumerate(request.messages):
        if message.unique_key:
            keys.append(message.unique_key)
            continue
        seq = request.first_sequence + index
        digest = hashlib.blake2b(f"{where}/{seq}".encode(), digest_size=16).hexdigest()
        keys.append(digest.upper())
    return keys


def idempotent_run(
    request: pb.ProduceRequest,
    queue_id: int,
    unique_keys: Sequence[str],
    born_host: bytes,
    now_ms: int,
) -> bytes:
    count = len(request.messages)
    first_seq = request.first_sequence
    extra = (
        f"{PRODUCER_ID}\x01{request.producer_id}\x02"
        f"{PRODUCER_SEQ}\x01{format_sequences(first_seq, first_seq + count - 1)}\x02"
    ).encode()
    if request.producer_epoch:
        extra += f"{PRODUCER_EPOCH}\x01{request.producer_epoch}\x02".encode()
    writer = RunWriter(born_host)
    for message, unique_key in zip(request.messages, unique_keys, strict=True):
        topic = message.topic
        writer.add(
            topic,
            topic.encode("utf-8"),
            queue_id,
            message.body,
            message_properties(message, unique_key) + extra,
            message.flag,
            0,
            message.born_timestamp_ms or now_ms,
        )
    return writer.getvalue()


async def produce_idempotent(
    request: pb.ProduceRequest,
    routes: RouteCache,
    channels: BrokerChannels,
    view: TopicView,
    born_host: bytes,
    now_ms: int,
    timeout_s: float,
) -> pb.ProduceResponse:
    check_idempotent(request)
    first = request.messages[0]
    view, queue = await explicit_queue(routes, 0, first, view)
    member = view.master(queue.broker_name)
    if member is None:
        raise ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            f"broker {quote(queue.broker_name)} has no master now: retry the same batch later",
        )
    unique_keys = derived_unique_keys(request)
    run = idempotent_run(request, queue.queue_id, unique_keys, born_host, now_ms)
    response = await _append(channels, member, queue, run, request, timeout_s)
    count = len(request.messages)
    if len(response.physical_offsets) != count or len(response.queue_offsets) != count:
        raise ServiceError(
            grpc.StatusCode.INTERNAL,
            f"broker {member.broker_name} answered {len(response.physical_offsets)} offsets "
            f"for {count} records",
        )
    rows = written_rows(member.broker_name, [queue.queue_id] * count, response, 0)
    respond = runs_response if request.compact_results else produce_response
    answer = respond(unique_keys, rows, [None] * count)
    answer.duplicate = response.duplicate
    return answer


async def _append(
    channels: BrokerChannels,
    member: Member,
    queue: QueueRef,
    run: bytes,
    request: pb.ProduceRequest,
    timeout_s: float,
) -> storage_pb.AppendResponse:
    append = storage_pb.AppendRequest(
        records=[run],
        producer_id=request.producer_id,
        first_sequence=request.first_sequence,
        producer_epoch=request.producer_epoch,
    )
    try:
        return await channels.storage(member.storage).Append(append, timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        what = f"idempotent Append to broker {member.broker_name} queue {queue.queue_id}"
        raise broker_error(exc, what) from exc

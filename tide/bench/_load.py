"""The load generator: asyncio producers sending prebuilt Produce requests, long-polling
consumers, and a sampler that keeps the timeline.

Kept cheap on purpose (the client shares the cores with the cluster): each producer
serializes its ``ProduceRequest`` once with a placeholder where every body starts, and
per call only swaps in the send time (16 hex digits of ``time.time_ns()``) with one
``bytes.replace``; calls go through a raw ``grpc.aio`` method (no serializer), one call
per request, or (``produce_api: stream``) the requests written on one ``ProduceStream``
per producer (reopened after a failure; its unanswered requests count as failed calls).
A consumer
pulls stored records (``ENCODING_RECORDS``, what tide.client asks for), reads the first
16 bytes of each body back and records ``now - sent`` as the end-to-end
latency (once per distinct stamp in a Pull answer, with its count).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from tide.auth.client import Credentials, aio_signing_interceptors
from tide.bench._stats import Latency
from tide.bench._workload import STAMP_BYTES, Workload
from tide.client._produce_stream import answers_in
from tide.client._rpc import ClientTls, tls_credentials
from tide.format import SYS_FLAG_POS, body_length_pos
from tide.v1 import gateway_pb2 as pb

PRODUCE_METHOD = "/tide.v1.Gateway/Produce"
PRODUCE_STREAM_METHOD = "/tide.v1.Gateway/ProduceStream"
PULL_METHOD = "/tide.v1.Gateway/Pull"
PLACEHOLDER = b"\x7f~TIDE-BENCH-TS~"  # STAMP_BYTES long; never in a proto's framing
CALL_TIMEOUT_S = 30.0
RETRY_PAUSE_S = 0.2
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 128 << 20),
    ("grpc.max_send_message_length", 128 << 20),
]

# The low byte of a record's SYSFLAG (big-endian, at 36): it holds the host-size bits.
SYSFLAG_POS = SYS_FLAG_POS + 3  # its low byte (big-endian)

assert len(PLACEHOLDER) == STAMP_BYTES


def stamp(now_ns: int) -> bytes:
    return b"%016x" % now_ns


def sent_ns(body: bytes) -> int:
    """The send time a producer put in front of ``body``."""
    return int(body[:STAMP_BYTES], 16)


def body_stamps(records: bytes, count: int, length: int = STAMP_BYTES) -> list[bytes]:
    """The send stamp (the first ``length`` bytes) of each body of ``count`` stored
    records back to back (a RECORDS pull's answer), read through the size fields without
    decoding the rest. Records all of one size and layout (one Produce call's, what a
    pull mostly carries) are read by stride (:func:`_uniform_stamps`)."""
    if count and len(records) % count == 0:
        stamps = _uniform_stamps(records, count, len(records) // count, length)
        if stamps is not None:
            return stamps
    return _walked_stamps(records, count, length)


def _uniform_stamps(records: bytes, count: int, size: int, length: int) -> list[bytes] | None:
    """The stamps when every record is ``size`` bytes long and has the first one's host
    sizes, checked with strided slices (one C call per byte checked, not a Python step
    per record): each record's TOTALSIZE and SYSFLAG low byte equal the first's. None
    when they do not (the walk then reads them one by one)."""
    head = records[:4]
    if int.from_bytes(head, "big") != size:
        return None
    for index in range(4):
        if records[index::size] != head[index : index + 1] * count:
            return None
    flag = records[SYSFLAG_POS : SYSFLAG_POS + 1]
    if records[SYSFLAG_POS::size] != flag * count:
        return None
    body = body_length_pos(flag[0]) + 4
    return [records[pos : pos + length] for pos in range(body, len(records), size)]


def _walked_stamps(records: bytes, count: int, length: int) -> list[bytes]:
    """The stamps of records of any sizes, one record after the other."""
    stamps: list[bytes] = []
    pos = 0
    for _ in range(count):
        size = int.from_bytes(records[pos : pos + 4], "big")
        body = pos + body_length_pos(records[pos + SYSFLAG_POS]) + 4
        stamps.append(records[body : body + length])
        pos += size
    if pos != len(records):
        raise AssertionError(f"{count} records end at {pos} of {len(records)} bytes")
    return stamps


def request_template(
    topic: str, message_size: int, batch_size: int, *, pack_answers: bool = False
) -> bytes:
    """A serialized ProduceRequest whose bodies start with :data:`PLACEHOLDER`; it asks
    for compact results (a run per queue, as tide.client does) and, for a ProduceStream,
    for packed answers (as tide.client's stream does)."""
    body = PLACEHOLDER + b"x" * (message_size - STAMP_BYTES)
    request = pb.ProduceRequest(
        messages=[pb.ProduceMessage(topic=topic, body=body)] * batch_size,
        compact_results=True,
        pack_answers=pack_answers,
    )
    data = request.SerializeToString()
    if data.count(PLACEHOLDER) != batch_size:
        raise AssertionError("the placeholder is not unique in the request")
    return data


@dataclass(frozen=True)
class QueueRef:
    topic: str
    broker_name: str
    queue_id: int


@dataclass
class Counters:
    """What happened, for the whole run (warm-up included) and since measuring began."""

    published: int = 0
    consumed: int = 0
    publish_calls: int = 0
    publish_errors: int = 0  # failed calls (their messages are not counted as published)
    send_failed: int = 0  # messages answered SEND_FAILED or another non-OK status
    consume_errors: int = 0  # failed Pull calls (retried)
    offset_resets: int = 0  # OFFSET_ILLEGAL answers
    last_error: str = ""


@dataclass
class Sample:
    t_s: float  # since the start of the warm-up
    measuring: bool
    published: int  # in this interval
    consumed: int
    interval_s: float
    backlog: int
    publish_p50_ms: float
    publish_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float

    def to_dict(self) -> dict[str, Any]:
        rate = 1 / self.interval_s if self.interval_s > 0 else 0.0
        return {
            "t_s": round(self.t_s, 3),
            "measuring": self.measuring,
            "publish_rate": round(self.published * rate, 1),
            "consume_rate": round(self.consumed * rate, 1),
            "backlog": self.backlog,
            "publish_p50_ms": self.publish_p50_ms,
            "publish_p99_ms": self.publish_p99_ms,
            "e2e_p50_ms": self.e2e_p50_ms,
            "e2e_p99_ms": self.e2e_p99_ms,
        }


@dataclass
class LoadState:
    counters: Counters = field(default_factory=Counters)
    publish_latency: Latency = field(default_factory=Latency)
    e2e_latency: Latency = field(default_factory=Latency)
    stop_producing: asyncio.Event = field(default_factory=asyncio.Event)
    stop_consuming: asyncio.Event = field(default_factory=asyncio.Event)
    drain_s: float = 0.0  # how long the consumers took to catch up after the producers

    def note_error(self, error: BaseException) -> None:
        if isinstance(error, grpc.aio.AioRpcError):
            self.counters.last_error = f"{error.code().name}: {error.details()}"
        else:
            self.counters.last_error = repr(error)


def open_channel(target: str, tls: ClientTls = False) -> grpc.aio.Channel:
    """A channel to the gateway: plaintext, or TLS as tide.client's ``tls=`` says; signing
    every call when TIDE_ACCESS_KEY / TIDE_SECRET_KEY are set (a gateway with
    --auth-enabled; the CLI's --access-key / --secret-key-file set them)."""
    credentials = tls_credentials(tls)
    interceptors = aio_signing_interceptors(Credentials.from_env()) or None
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS, interceptors=interceptors)
    return grpc.aio.secure_channel(
        target, credentials, options=CHANNEL_OPTIONS, interceptors=interceptors
    )


class Pacer:
    """Hands out send slots: at most ``rate`` messages/s in calls of ``batch`` messages
    (0: no limit)."""

    def __init__(self, rate: float, batch: int) -> None:
        self.interval_s = batch / rate if rate > 0 else 0.0
        self.start = time.monotonic()
        self.slot = 0

    async def wait(self) -> None:
        if not self.interval_s:
            return
        due = self.start + self.slot * self.interval_s
        self.slot += 1
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


async def produce(
    channel: grpc.aio.Channel,
    state: LoadState,
    template: bytes,
    workload: Workload,
    rate: float,
) -> None:
    """One producer: ``workload.inflight`` requests of ``template`` (stamped) in flight
    until ``state.stop_producing`` is set, at most ``rate`` messages/s; a call each or
    on a ProduceStream (``workload.produce_api``)."""
    if workload.produce_api == "stream":
        await produce_stream(channel, state, template, workload.batch_size, workload.inflight, rate)
    else:
        await produce_unary(channel, state, template, workload.batch_size, workload.inflight, rate)


async def produce_unary(
    channel: grpc.aio.Channel,
    state: LoadState,
    template: bytes,
    batch_size: int,
    inflight: int,
    rate: float,
) -> None:
    """``inflight`` callers sending ``template`` (stamped), a Produce call each."""
    call = channel.unary_unary(
        PRODUCE_METHOD, request_serializer=None, response_deserializer=pb.ProduceResponse.FromString
    )
    pacer = Pacer(rate, batch_size)
    counters = state.counters
    latency = state.publish_latency
    stop = state.stop_producing

    async def caller() -> None:
        while not stop.is_set():
            await pacer.wait()
            if stop.is_set():
                return
            begin = time.monotonic_ns()
            request = template.replace(PLACEHOLDER, stamp(time.time_ns()))
            try:
                reply = await call(request, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                counters.publish_errors += 1
                state.note_error(error)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            latency.record((time.monotonic_ns() - begin) // 1000)
            _count_results(state, reply)

    await asyncio.gather(*(caller() for _ in range(inflight)))


def _count_results(state: LoadState, reply: pb.ProduceResponse) -> None:
    counters = state.counters
    counters.publish_calls += 1
    runs = reply.runs  # compact results: one run per queue (or per failure)
    if runs:
        failed = sum(run.count for run in runs if run.status)  # SEND_OK is 0
        answered = sum(run.count for run in runs)
        errors = (run.error for run in runs if run.status)
    else:  # a gateway that answers a result per message (it predates compact results)
        failed = sum(1 for result in reply.results if result.status)
        answered = len(reply.results)
        errors = (result.error for result in reply.results if result.status)
    if failed:
        counters.send_failed += failed
        counters.last_error = next(errors)
    counters.published += answered - failed


async def produce_stream(
    channel: grpc.aio.Channel,
    state: LoadState,
    template: bytes,
    batch_size: int,
    inflight: int,
    rate: float,
) -> None:
    """``template`` (stamped) written on a ProduceStream, ``inflight`` unanswered at
    most; a stream that fails counts its unanswered requests as failed calls and is
    opened again after a pause."""
    method = channel.stream_stream(
        PRODUCE_STREAM_METHOD,
        request_serializer=None,
        response_deserializer=pb.ProduceStreamResponse.FromString,
    )
    pacer = Pacer(rate, batch_size)
    while not state.stop_producing.is_set():
        sent: deque[int] = deque()  # monotonic ns of the unanswered requests, in order
        try:
            await _stream_session(method(), state, template, inflight, pacer, sent)  # type: ignore[call-arg]
        except grpc.aio.AioRpcError as error:
            state.counters.publish_errors += max(1, len(sent))
            state.note_error(error)
            await asyncio.sleep(RETRY_PAUSE_S)


async def _stream_session(
    call: Any,
    state: LoadState,
    template: bytes,
    inflight: int,
    pacer: Pacer,
    sent: deque[int],
) -> None:
    """One stream until the producers stop (then half-closed and read to its end)."""
    slots = asyncio.Semaphore(inflight)
    stop = state.stop_producing

    async def writer() -> None:
        while not stop.is_set():
            await slots.acquire()
            await pacer.wait()
            if stop.is_set():
                break
            sent.append(time.monotonic_ns())
            await call.write(template.replace(PLACEHOLDER, stamp(time.time_ns())))
        await call.done_writing()

    writing = asyncio.create_task(writer())
    try:
        async for message in call:
            for answer in answers_in(message):  # its own, then those packed with it
                begin = sent.popleft()
                slots.release()
                if answer.error_code:
                    state.counters.publish_errors += 1
                    state.counters.last_error = f"code {answer.error_code}: {answer.error_message}"
                    continue
                state.publish_latency.record((time.monotonic_ns() - begin) // 1000)
                _count_results(state, answer.response)
        await writing
    finally:  # when the stream failed, its error is raised, not the writer's
        writing.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await writing


async def consume_queue(
    channel: grpc.aio.Channel,
    state: LoadState,
    group: str,
    ref: QueueRef,
    workload: Workload,
    positioned: Callable[[], None] | None = None,
) -> None:
    """Long-poll one queue from its current end until ``state.stop_consuming`` is set;
    ``positioned`` is called once the starting offset is known."""
    pull = channel.unary_unary(
        PULL_METHOD,
        request_serializer=pb.PullRequest.SerializeToString,
        response_deserializer=pb.PullResponse.FromString,
    )
    offsets = channel.unary_unary(
        "/tide.v1.Gateway/GetQueueOffsets",
        request_serializer=pb.QueueOffsetsRequest.SerializeToString,
        response_deserializer=pb.QueueOffsetsResponse.FromString,
    )
    answer = await offsets(
        pb.QueueOffsetsRequest(topic=ref.topic, broker_name=ref.broker_name, queue_id=ref.queue_id),
        timeout=CALL_TIMEOUT_S,
    )
    if positioned is not None:
        positioned()
    request = pb.PullRequest(
        consumer_group=group,
        topic=ref.topic,
        broker_name=ref.broker_name,
        queue_id=ref.queue_id,
        offset=answer.max_offset,
        max_messages=workload.pull_batch,
        long_poll_timeout_ms=workload.long_poll_ms,
        encoding=pb.PullRequest.ENCODING_RECORDS,
        min_messages=workload.pull_min_messages,
        min_messages_wait_ms=workload.pull_min_wait_ms,
    )
    counters = state.counters
    record = state.e2e_latency.record
    stop = state.stop_consuming
    timeout_s = max(workload.long_poll_ms, workload.pull_min_wait_ms) / 1000 + CALL_TIMEOUT_S
    while not stop.is_set():
        try:
            reply = await pull(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            counters.consume_errors += 1
            state.note_error(error)
            await asyncio.sleep(RETRY_PAUSE_S)
            continue
        if reply.status == pb.PullResponse.OFFSET_ILLEGAL:
            counters.offset_resets += 1
        if reply.record_count:
            now_ns = time.time_ns()
            # The messages of one Produce call share a stamp: one record per stamp.
            stamps = Counter(body_stamps(reply.records, reply.record_count))
            for sent, count in stamps.items():
                record((now_ns - int(sent, 16)) // 1000, count)
            counters.consumed += reply.record_count
        request.offset = reply.next_offset
        request.max_messages = next_pull_size(workload, request.max_messages, reply.record_count)


def next_pull_size(workload: Workload, asked: int, got: int) -> int:
    """The next pull's max_messages: a full answer means the queue holds more (the consumer
    is behind), so it asks for twice as many, up to ``pull_batch_max``: fewer, larger pulls
    catch up with less per-pull cost and fewer round trips, as a Kafka fetch takes what is
    there up to its byte limit. A short answer (caught up) goes back to ``pull_batch``."""
    if got >= asked:
        return min(max(asked * 2, workload.pull_batch), workload.pull_batch_max or asked)
    return workload.pull_batch


async def sample(
    state: LoadState,
    interval_s: float,
    measuring: Callable[[], bool],
    started: float,
    timeline: list[Sample],
) -> None:
    """Every ``interval_s``: one :class:`Sample` (rates, backlog, interval percentiles)."""
    counters = state.counters
    last = (time.monotonic(), counters.published, counters.consumed)
    while True:
        await asyncio.sleep(interval_s)
        now = time.monotonic()
        publish = state.publish_latency.tick()
        e2e = state.e2e_latency.tick()
        timeline.append(
            Sample(
                t_s=now - started,
                measuring=measuring(),
                published=counters.published - last[1],
                consumed=counters.consumed - last[2],
                interval_s=now - last[0],
                # a message can be consumed before its Produce call is answered
                backlog=max(0, counters.published - counters.consumed),
                publish_p50_ms=publish["p50"],
                publish_p99_ms=publish["p99"],
                e2e_p50_ms=e2e["p50"],
                e2e_p99_ms=e2e["p99"],
            )
        )
        last = (now, counters.published, counters.consumed)

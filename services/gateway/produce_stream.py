"""``ProduceStream``: a pipelined Produce on one bidi stream.

Per stream, a reader task takes requests off the stream and starts one task per request
(the same :meth:`Producer.produce` a unary Produce runs), while the handler's generator
answers the tasks in request order. The reader reads the next request only while fewer
than :data:`MAX_PRODUCE_STREAM_IN_FLIGHT` requests are started and not yet answered and
their bytes are below ``max_produce_stream_in_flight_bytes`` (backpressure: a faster
producer is held back by HTTP/2 flow control; the request read then may pass the byte
limit by its own size). Every request also takes its bytes from the gateway-wide
produce budget (``max_produce_in_flight_bytes``, shared with the unary Produce) while it
runs; a request that does not fit is answered RESOURCE_EXHAUSTED in-band, naming the
limit, without being processed, and the stream goes on.

A request that asks for ``pack_answers`` may be answered inside the answer of a request
before it (``ProduceStreamResponse.next``): when the answerer writes an answer, the
answers of the requests right after it that are ready ride along (at most
:data:`MAX_PACKED_ANSWERS`). Each stream message costs both ends a gRPC write or read
whose completion waits for a turn of the event loop; under load one answer per message
capped a stream's rate (measured 2026-11-28: ~320 us a write on a busy gateway, ~2,000
answers/s on one stream, docs/performance.md "One stream's answers"). Order and content
are unchanged; a client that does not set the flag gets one answer per message.

A request's failure is answered in-band: a :class:`ServiceError` as its status code
(``grpc.StatusCode`` value number) and message, anything else as INTERNAL (logged with its
traceback). The stream ends

* when the client half-closes: every request read is answered, then status OK;
* when the client cancels or goes away: the started requests are cancelled;
* on :meth:`ProduceStreams.drain` (the gateway shuts down): the reader stops, the requests
  read are answered, then the stream ends UNAVAILABLE (the others were not processed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import grpc

from services.gateway.validate import check_produce_size
from tide.server import ByteBudget, ServiceError
from tide.v1 import gateway_pb2 as pb

log = logging.getLogger("tide.gateway.produce_stream")

# Requests of one stream processed concurrently (started and not yet answered).
MAX_PRODUCE_STREAM_IN_FLIGHT = 32
# Answers packed into one ProduceStreamResponse besides its own: all a stream may have in
# flight, so one write can answer everything that was ready.
MAX_PACKED_ANSWERS = MAX_PRODUCE_STREAM_IN_FLIGHT
# ... and at most this many bytes of packed answers in one message: a fourth of the 4 MiB a
# gRPC client receives by default (answers with a result per message of 1,000-message
# requests are ~100 KB each; compact ones a few hundred bytes).
MAX_PACKED_ANSWER_BYTES = 1 << 20
# Streams open at once; more are refused RESOURCE_EXHAUSTED.
MAX_PRODUCE_STREAMS = 4096
# Bytes of the requests of one stream started and not yet done: the default of
# max_produce_stream_in_flight_bytes (the reader stops reading at it).
DEFAULT_PRODUCE_STREAM_IN_FLIGHT_BYTES = 32 << 20

# (request, peer, the request's encoded size in bytes, the request serialized)
ProduceOne = Callable[
    [pb.ProduceRequest, str, int, bytes | None], Coroutine[Any, Any, pb.ProduceResponse]
]
_DRAINED = object()  # queued by drain(): no more requests will be read
_NOTHING = object()  # _Stream.carried when the answerer carries no item


class _ReadFailed:
    """Queued when reading the request stream failed."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class _Stream:
    """One open stream: its reader task and the queue of its requests' tasks."""

    __slots__ = ("budget", "carried", "packable", "queue", "reader", "slots")

    def __init__(self, max_in_flight_bytes: int) -> None:
        self.slots = asyncio.Semaphore(MAX_PRODUCE_STREAM_IN_FLIGHT)
        self.budget = ByteBudget(
            "max_produce_stream_in_flight_bytes", max_in_flight_bytes, "one stream's requests"
        )
        # Request tasks in order, then None (the client half-closed), _DRAINED or a
        # _ReadFailed; at most MAX_PRODUCE_STREAM_IN_FLIGHT + 1 items.
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.reader: asyncio.Task[None] | None = None
        # The tasks of the requests that asked for pack_answers (not yet answered), and the
        # item the answerer took off the queue while packing and answers next.
        self.packable: set[asyncio.Task[pb.ProduceResponse]] = set()
        self.carried: object = _NOTHING


class ProduceStreams:
    """Serves the ProduceStream calls; ``produce`` runs one request (the metrics wrap
    it: one latency record per request)."""

    def __init__(
        self,
        produce: ProduceOne,
        budget: ByteBudget,
        stream_in_flight_bytes: int = DEFAULT_PRODUCE_STREAM_IN_FLIGHT_BYTES,
    ) -> None:
        """``budget``: the gateway's produce bytes in flight (the unary Produce takes from
        it too); ``stream_in_flight_bytes``: one stream's (backpressure)."""
        self.produce = produce
        self.budget = budget
        self.stream_in_flight_bytes = stream_in_flight_bytes
        self._streams: set[_Stream] = set()
        self._draining = False

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def drain(self) -> None:
        """End every stream soon: stop reading requests; those read are answered, then the
        stream ends UNAVAILABLE. Streams opened from now on are refused."""
        self._draining = True
        for stream in self._streams:
            _stop_reading(stream)

    async def serve(
        self, requests: AsyncIterator[pb.ProduceRequest], peer: str
    ) -> AsyncIterator[pb.ProduceStreamResponse]:
        if self._draining:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "the gateway is shutting down")
        if len(self._streams) >= MAX_PRODUCE_STREAMS:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{MAX_PRODUCE_STREAMS} ProduceStream calls are open on this gateway",
            )
        stream = _Stream(self.stream_in_flight_bytes)
        stream.reader = asyncio.create_task(self._read(stream, requests, peer))
        self._streams.add(stream)
        try:
            async for response in _answers(stream):
                yield response
        finally:
            self._streams.discard(stream)
            await _cancel_outstanding(stream)

    async def _read(
        self, stream: _Stream, requests: AsyncIterator[pb.ProduceRequest], peer: str
    ) -> None:
        """Start a task per request, at most MAX_PRODUCE_STREAM_IN_FLIGHT unanswered and
        reading only below the stream's byte limit; then queue the end (None) or the
        request stream's failure."""
        slots, queue = stream.slots, stream.queue
        iterator = aiter(requests)
        try:
            while True:
                await slots.acquire()
                await stream.budget.wait_below()
                try:
                    # No await between the read and the put: drain() never sees a task
                    # half queued. No local keeps the request once its task has it.
                    queue.put_nowait(self._start(stream, await anext(iterator), peer))
                except StopAsyncIteration:
                    queue.put_nowait(None)
                    return
        except Exception as exc:  # answered after the requests before it, then raised
            queue.put_nowait(_ReadFailed(exc))

    def _start(
        self, stream: _Stream, request: pb.ProduceRequest, peer: str
    ) -> asyncio.Task[pb.ProduceResponse]:
        """The request's task; its bytes are held (the stream's and the gateway's) until
        it is done, or it is refused RESOURCE_EXHAUSTED by the gateway's budget."""
        # Serialized once: its length is the size, its bytes the produce's (one encode
        # of the request, where ByteSize and the bytes path's own serialization were two).
        wire = request.SerializeToString()
        size = len(wire)
        try:
            check_produce_size(size)  # first: a permanent refusal, not a retryable one
            self.budget.take(size)
        except ServiceError as exc:
            return asyncio.create_task(_refuse(exc))  # never packed: answered on its own
        stream.budget.force(size)
        task = asyncio.create_task(self.produce(request, peer, size, wire))
        task.add_done_callback(lambda _: _give(size, stream.budget, self.budget))
        if request.pack_answers:
            stream.packable.add(task)
        return task


async def _refuse(exc: ServiceError) -> pb.ProduceResponse:
    raise exc


def _give(size: int, *budgets: ByteBudget) -> None:
    for budget in budgets:
        budget.give(size)


def _stop_reading(stream: _Stream) -> None:
    reader = stream.reader
    if reader is not None and not reader.done():
        reader.cancel()
        stream.queue.put_nowait(_DRAINED)


async def _answers(stream: _Stream) -> AsyncIterator[pb.ProduceStreamResponse]:
    """Each started request's answer, in order, until the end of the stream."""
    queue, slots = stream.queue, stream.slots
    while True:
        item, stream.carried = stream.carried, _NOTHING
        if item is _NOTHING:
            item = await queue.get()
        if item is None:
            return
        if item is _DRAINED:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                "the gateway is shutting down: the requests not answered were not "
                "processed; send them again",
            )
        if isinstance(item, _ReadFailed):
            raise item.error
        if not isinstance(item, asyncio.Task):  # only tasks and the markers are queued
            raise TypeError(f"unexpected item in a ProduceStream queue: {item!r}")
        stream.packable.discard(item)
        answer = await _answer(item)
        answered = 1 + _pack(stream, answer)
        yield answer
        for _ in range(answered):
            slots.release()


def _pack(stream: _Stream, answer: pb.ProduceStreamResponse) -> int:
    """Add to ``answer.next`` the answers of the queued requests that follow it while
    they asked for packing, are done and fit (MAX_PACKED_ANSWERS, MAX_PACKED_ANSWER_BYTES);
    the first item that does not stays carried, for the next message."""
    queue, packable, packed, size = stream.queue, stream.packable, 0, 0
    while packed < MAX_PACKED_ANSWERS and not queue.empty():
        item = queue.get_nowait()
        if (
            isinstance(item, asyncio.Task)
            and item in packable
            and item.done()
            and not item.cancelled()
        ):
            following = _answer_of_done(item)
            size += following.ByteSize()
            if size <= MAX_PACKED_ANSWER_BYTES:
                packable.discard(item)
                answer.next.append(following)
                packed += 1
                continue
        stream.carried = item
        break
    return packed


async def _answer(task: asyncio.Task[pb.ProduceResponse]) -> pb.ProduceStreamResponse:
    try:
        response = await task
    except Exception as exc:
        return _failed(exc)
    return pb.ProduceStreamResponse(response=response)


def _answer_of_done(task: asyncio.Task[pb.ProduceResponse]) -> pb.ProduceStreamResponse:
    """:func:`_answer` of a task that is done (and not cancelled), without awaiting."""
    try:
        response = task.result()
    except Exception as exc:
        return _failed(exc)
    return pb.ProduceStreamResponse(response=response)


def _failed(exc: Exception) -> pb.ProduceStreamResponse:
    if isinstance(exc, ServiceError):
        return pb.ProduceStreamResponse(error_code=exc.code.value[0], error_message=exc.message)
    log.error("unexpected error in a ProduceStream request", exc_info=exc)
    return pb.ProduceStreamResponse(
        error_code=grpc.StatusCode.INTERNAL.value[0],
        error_message=f"{type(exc).__name__}: {exc}",
    )


async def _cancel_outstanding(stream: _Stream) -> None:
    """Cancel the reader and every request not answered; wait for them (a failure other
    than the cancellation is logged)."""
    tasks: list[asyncio.Task[object]] = []
    if stream.reader is not None:
        tasks.append(stream.reader)
    items = [stream.carried]
    while not stream.queue.empty():
        items.append(stream.queue.get_nowait())
    tasks.extend(item for item in items if isinstance(item, asyncio.Task))
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.warning(
                "a ProduceStream task failed after the stream ended", exc_info=task.exception()
            )

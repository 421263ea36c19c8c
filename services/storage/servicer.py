"""``tide.v1.Storage`` over the engine: request checks, status codes, async waits.

Handlers run on the asyncio loop. An append takes the engine's lock briefly on the loop
thread; the SYNC_FLUSH wait is an awaited future, so waiting callers hold no thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from concurrent.futures import Future
from functools import partial
from typing import NoReturn

import grpc
from opentelemetry import trace

from services.storage import auth_rpc, convert, position_read, span_read
from services.storage.append_answer import columns_answer, columns_response
from services.storage.cold_reads import read_chunk
from services.storage.engine.commitlog import AppendBatch, CommitLog, OffsetBelowMinError
from services.storage.engine.consumer_manager import (
    ConsumerManager,
    InvalidConsumerError,
    Member,
    Subscription,
)
from services.storage.engine.errors import (
    AlreadyStoredError,
    DiskFullError,
    FencedProducerError,
    InvalidMessageError,
    NotWritableError,
    ProducerLimitError,
    SequenceError,
    StoreError,
    TopicNotFoundError,
)
from services.storage.engine.message_store import MessageStore, PutResult
from services.storage.engine.producer_runs import CoalescedRetryError, ProducerBatch
from services.storage.engine.queue_locks import QueueLockManager, TooManyLocks
from services.storage.options import DEFAULT_APPEND_IN_FLIGHT_BYTES, MAX_TAIL_CHUNK_BYTES
from services.storage.replication.node import Replication, wait_replicated
from services.storage.retry_topics import ensure_retry_topic
from tide.files import ConfigLimitError, is_out_of_space
from tide.format import is_hidden_topic, producer_id_error, scan_run
from tide.limits import READ_MAX_POSITIONS
from tide.naming import consumer_group_error
from tide.quoting import quote
from tide.server import ByteBudget, ColdReads, ServiceError, StreamSlots, peer_address
from tide.server._framed import framed_answer, tail_chunk_frame
from tide.server._request_streams import RequestStreams
from tide.server._telemetry import TRACING
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

MAX_READ_POSITIONS = READ_MAX_POSITIONS
MAX_READ_BYTES = 64 << 20
# Open Tail streams (dispatches following this storage, tools): each holds one chunk of
# at most MAX_TAIL_CHUNK_BYTES at a time.
MAX_TAIL_STREAMS = 256
# Open Replicate streams (slaves): each holds one chunk of at most --ha-batch-bytes.
MAX_REPLICATE_STREAMS = 64
TAIL_IDLE_RECHECK_S = 1.0
# A Tail stream that sent its last chunk less than TAIL_BUSY_S before an append woke it
# waits TAIL_LINGER_S more before reading, so the appends of a busy stream ride fewer,
# larger chunks: each chunk costs its follower (the dispatch) a gRPC read, a scan and
# an apply of fixed cost, ~0.5 us a message at the ~120 KB chunks of a producers-only
# run (docs/performance.md, "Dispatch apply: where the time goes"). Slower streams
# (one chunk in 5 ms or more) get theirs at once: no latency added there.
TAIL_BUSY_S = 0.005
TAIL_LINGER_S = 0.002

_ERROR_CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (InvalidMessageError, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidConsumerError, grpc.StatusCode.INVALID_ARGUMENT),
    (convert.BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (TopicNotFoundError, grpc.StatusCode.NOT_FOUND),
    (DiskFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ConfigLimitError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (NotWritableError, grpc.StatusCode.FAILED_PRECONDITION),
    (SequenceError, grpc.StatusCode.OUT_OF_RANGE),
    (AlreadyStoredError, grpc.StatusCode.ALREADY_EXISTS),
    (FencedProducerError, grpc.StatusCode.FAILED_PRECONDITION),
    (ProducerLimitError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (CoalescedRetryError, grpc.StatusCode.ABORTED),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    (StoreError, grpc.StatusCode.UNAVAILABLE),
    (TimeoutError, grpc.StatusCode.UNAVAILABLE),
)


def _fail(exc: Exception, store: MessageStore | None = None) -> NoReturn:
    if store is not None and is_out_of_space(exc):
        # ENOSPC from any write (a config file, an offset table, ...): the store's
        # disk-full state, answered as a full disk is, not as an internal error.
        assert isinstance(exc, OSError)
        what = f"writing {exc.filename}" if exc.filename else "writing"
        raise ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, str(store.guard.out_of_space(exc, what))
        ) from exc
    for kind, code in _ERROR_CODES:
        if isinstance(exc, kind):
            raise ServiceError(code, str(exc)) from exc
    raise exc


def _append_response(
    batch: AppendBatch,
    request: pb.AppendRequest,
    status: pb.AppendStatus.ValueType,
    prefix: str,
) -> pb.AppendResponse:
    """One result per message, in request order (``results.add`` with keywords is the
    fastest way to build them; PUT_OK is the default and not set)."""
    assert len(batch.sizes) == len(request.messages)
    response = pb.AppendResponse()
    add = response.results.add
    ts = batch.store_timestamp_ms
    # make_msg_id inline: the prefix, then the offset as 16 upper-case hex digits.
    for phys, size, queue_offset in zip(
        batch.physical_offsets, batch.sizes, batch.queue_offsets, strict=True
    ):
        if status == pb.PUT_OK:
            add(
                msg_id=f"{prefix}{phys:016X}",
                physical_offset=phys,
                queue_offset=queue_offset,
                store_timestamp_ms=ts,
                size=size,
            )
        else:
            add(
                status=status,
                msg_id=f"{prefix}{phys:016X}",
                physical_offset=phys,
                queue_offset=queue_offset,
                store_timestamp_ms=ts,
                size=size,
            )
    return response


async def _wait_set(event: asyncio.Event, timeout_s: float) -> None:
    """Until ``event`` is set or ``timeout_s`` passed (then callers re-check: retention
    may have moved the min offset). A timer, no task: a Tail stream following live waits
    once per append (two tasks and ``asyncio.wait`` took twice as long, ~35 us more)."""
    timer = asyncio.get_running_loop().call_later(timeout_s, event.set)
    try:
        await event.wait()
    finally:
        timer.cancel()


_tracer = trace.get_tracer("tide.storage")
_APPEND_ANSWER = framed_answer(pb.AppendStreamResponse)


def _name_span(request: pb.AppendRequest, count: int) -> None:
    """The Append span names the batch's first topic and queue, and its size."""
    span = trace.get_current_span()
    if not span.is_recording() or not count:
        return
    if request.messages:
        first = request.messages[0]
        topic, queue_id = first.topic, first.queue_id
    else:
        first_run = request.records[0]
        layout = scan_run(first_run[: _record_size(first_run)], 1 << 30)
        topic, queue_id = layout.topics[0].decode("utf-8", "replace"), layout.queue_ids[0]
    span.set_attributes(
        {
            "messaging.destination.name": topic,
            "messaging.tide.queue_id": queue_id,
            "messaging.batch.message_count": count,
        }
    )


def _record_size(run: bytes) -> int:
    """The first record's total_size (its first 4 bytes)."""
    return int.from_bytes(run[:4], "big", signed=True)


def _invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


class StorageServicer(pb_grpc.StorageServicer):
    def __init__(
        self,
        store_provider: Callable[[], MessageStore],
        tail_chunk_bytes: int,
        consumers: ConsumerManager,
        append_in_flight_bytes: int = DEFAULT_APPEND_IN_FLIGHT_BYTES,
        queue_locks: QueueLockManager | None = None,
    ) -> None:
        self._store = store_provider
        # The bytes of the Append requests being handled (a sync flush or SYNC_MASTER
        # keeps them until the disk or a slave answered); past it RESOURCE_EXHAUSTED.
        self.append_budget = ByteBudget(
            "max_append_in_flight_bytes",
            append_in_flight_bytes,
            "Append requests in flight on this storage",
        )
        self._tail_chunk_bytes = tail_chunk_bytes
        self._consumers = consumers
        self.queue_locks = queue_locks or QueueLockManager()
        self._draining = asyncio.Event()
        self._tail_wakers: set[asyncio.Event] = set()  # of the Tail streams: drain sets them
        self._tail_slots = StreamSlots("Tail", MAX_TAIL_STREAMS, "MAX_TAIL_STREAMS")
        self._replicate_slots = StreamSlots(
            "Replicate", MAX_REPLICATE_STREAMS, "MAX_REPLICATE_STREAMS"
        )
        self._append_streams = RequestStreams("append", "appends")  # drain ends them too
        self._read_streams = RequestStreams("read", "reads")  # and these
        self._hosts: dict[bytes, str] = {}  # packed host -> "ip:port" (Read)
        self.cold_reads = ColdReads()  # reads of bytes not in memory, off the loop
        self.replication: Replication | None = None  # set by the service once open
        # Metrics: (messages, batch, perf_counter at the call's start) per answered Append.
        self.append_observer: Callable[[int, AppendBatch, float], None] | None = None

    def drain(self) -> None:
        """End every Tail, AppendStream and ReadStream stream (the server is shutting
        down). An AppendStream or ReadStream ends once its request in hand is answered. A
        Tail waiting for data or between chunks ends at once; one blocked because its
        consumer stopped reading (HTTP/2 flow control) is cancelled by the server at the
        end of the shutdown grace period."""
        self._draining.set()
        for waker in self._tail_wakers:
            waker.set()
        self._append_streams.drain()
        self._read_streams.drain()

    # -- messages ----------------------------------------------------------------
    @staticmethod
    def _check_message_count(count: int, store: MessageStore) -> None:
        if count == 0:
            raise _invalid("messages is empty: send at least one message (or records)")
        if count > store.config.max_batch_messages:
            raise _invalid(
                f"{count} messages in one Append; the limit is "
                f"{store.config.max_batch_messages}: split the batch"
            )

    async def Append(
        self, request: pb.AppendRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.AppendResponse:
        response = await self._append(request, context, TRACING.enabled, serialized=False)
        assert not isinstance(response, bytes)
        return response

    async def AppendStream(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[pb.AppendRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[bytes]:
        """Append's requests over one stream, answered in order and in-band (the
        protocol is in storage.proto). No spans per request: a stream carries no trace
        context (callers of a sampled trace use Append). The answers are serialized
        ``AppendStreamResponse``s (the service registers AppendStream with
        ``tide.server.serialized``), each response framed by hand (_APPEND_ANSWER), a
        ``records`` request's response serialized by hand too (append_answer.py)."""
        async for response in self._append_streams.serve(
            request_iterator, context, self._append_untraced, _APPEND_ANSWER
        ):
            yield response

    async def _append_untraced(
        self, request: pb.AppendRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.AppendResponse | bytes:
        return await self._append(request, context, False, serialized=True)

    async def _append(
        self,
        request: pb.AppendRequest,
        context: grpc.aio.ServicerContext[object, object],
        traced: bool,
        serialized: bool,
    ) -> pb.AppendResponse | bytes:
        """One Append: the response, or raises ServiceError (Append and AppendStream).
        ``traced``: name the current span and add the flush and replica wait spans.
        ``serialized``: a ``records`` request's response as its bytes.

        The request holds ``max_append_in_flight_bytes`` for its records' bytes (the
        run joined from them is what the storage keeps while it waits), or for its
        serialized size when it carries messages: ``ByteSize()`` serializes the whole
        request, ~59 us for an 88 KB request of records in one process, once per append
        (docs/performance.md, "The storage's Append answer and budget")."""
        chunks = list(request.records)  # one copy out of the request, used throughout
        size_bytes = sum(map(len, chunks)) if chunks else request.ByteSize()
        budget = self.append_budget
        budget.take(size_bytes)
        try:
            return await self._append_held(request, chunks, context, traced, serialized)
        finally:
            budget.give(size_bytes)

    async def _append_held(
        self,
        request: pb.AppendRequest,
        chunks: list[bytes],
        context: grpc.aio.ServicerContext[object, object],
        traced: bool,
        serialized: bool,
    ) -> pb.AppendResponse | bytes:
        started = time.perf_counter()
        store = self._store()
        if chunks and request.messages:
            raise _invalid("set messages or records, not both")
        try:
            if request.producer_runs:
                result = self._put_producer_runs(request, chunks, store)
            elif request.producer_id:
                result = self._put_idempotent(request, chunks, store)
            elif chunks:
                result = store.put_run(chunks)
            else:
                self._check_message_count(len(request.messages), store)
                result = store.put(request.messages, peer_address(context.peer()))
        except ServiceError:
            raise
        except Exception as exc:
            _fail(exc, store)
        count = len(result.batch.sizes)
        if traced:
            _name_span(request, count)
        status = pb.PUT_OK
        if result.durable is not None:
            if traced:
                with _tracer.start_as_current_span("storage.flush_wait"):
                    status = await self._wait_durable(result.durable, store)
            else:
                status = await self._wait_durable(result.durable, store)
        if result.replicated is not None:  # SYNC_MASTER
            if traced:
                with _tracer.start_as_current_span("storage.replica_wait"):
                    status = await wait_replicated(result.replicated, status, store)
            else:
                status = await wait_replicated(result.replicated, status, store)
        observer = self.append_observer
        if observer is not None:
            observer(count, result.batch, started)
        if chunks:
            answer = columns_answer if serialized else columns_response
            return answer(result.batch, status, store.msg_id_prefix, result.duplicate)
        return _append_response(result.batch, request, status, store.msg_id_prefix)

    @staticmethod
    def _put_idempotent(
        request: pb.AppendRequest, chunks: list[bytes], store: MessageStore
    ) -> PutResult:
        error = producer_id_error(request.producer_id)
        if error is not None:
            raise _invalid(f"producer_id {quote(request.producer_id)}: {error}")
        if not chunks or request.messages:
            raise _invalid("an idempotent Append (producer_id) carries records, not messages")
        if request.first_sequence < 0 or request.producer_epoch < 0:
            raise _invalid(
                f"first_sequence {request.first_sequence} and producer_epoch "
                f"{request.producer_epoch} must not be negative"
            )
        return store.put_run_idempotent(
            chunks, request.producer_id, request.producer_epoch, request.first_sequence
        )

    @staticmethod
    def _put_producer_runs(
        request: pb.AppendRequest, chunks: list[bytes], store: MessageStore
    ) -> PutResult:
        if request.producer_id or request.messages:
            raise _invalid(
                "producer_runs carries each run's producer fields: not with producer_id or messages"
            )
        batches: list[ProducerBatch] = []
        for index, entry in enumerate(request.producer_runs):
            error = producer_id_error(entry.producer_id)
            if error is not None:
                raise _invalid(
                    f"producer_runs[{index}].producer_id {quote(entry.producer_id)}: {error}"
                )
            if entry.first_sequence < 0 or entry.producer_epoch < 0:
                raise _invalid(
                    f"producer_runs[{index}]: first_sequence {entry.first_sequence} and "
                    f"producer_epoch {entry.producer_epoch} must not be negative"
                )
            batches.append(
                ProducerBatch(entry.producer_id, entry.producer_epoch, entry.first_sequence)
            )
        return store.put_producer_runs(chunks, batches)

    @staticmethod
    async def _wait_durable(
        durable: Future[None], store: MessageStore
    ) -> pb.AppendStatus.ValueType:
        timeout_s = store.config.sync_flush_timeout_ms / 1000
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(durable)), timeout_s)
        except TimeoutError:
            return pb.FLUSH_DISK_TIMEOUT
        except OSError as exc:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                f"messages were written but the flush failed: {exc}; retry or check the disk",
            ) from exc
        return pb.PUT_OK

    async def ReadStream(
        self,
        request_iterator: AsyncIterator[pb.ReadRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[pb.ReadStreamResponse]:
        """Read's requests over one stream, answered in order and in-band (the protocol
        is in storage.proto)."""
        async for response in self._read_streams.serve(
            request_iterator, context, self.Read, pb.ReadStreamResponse
        ):
            yield response

    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ReadResponse:
        """One Read: the response, or raises ServiceError (Read and ReadStream).

        ``positions``: one decoded StoredMessage per position. ``spans``: whole records
        as stored, one status per span (services/storage/span_read.py). A request has
        one or the other; at most MAX_READ_POSITIONS positions, spans or span records and
        MAX_READ_BYTES bytes."""
        commitlog = self._store().commitlog
        if request.spans:
            if request.positions:
                raise _invalid("a Read has positions or spans, not both")
            spans = request.spans
            span_read.check_spans(spans, MAX_READ_POSITIONS, MAX_READ_BYTES)
            if _resident(commitlog, ((s.physical_offset, s.size) for s in spans)):
                return span_read.read_spans(commitlog, spans)
            return await self.cold_reads.run(lambda: span_read.read_spans(commitlog, spans))
        if len(request.positions) > MAX_READ_POSITIONS:
            raise _invalid(
                f"{len(request.positions)} positions; at most {MAX_READ_POSITIONS} per Read"
            )
        total = sum(p.size for p in request.positions)
        if total > MAX_READ_BYTES:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Read asks for {total} bytes; at most {MAX_READ_BYTES} per call: split it",
            )
        positions, hosts = request.positions, self._hosts

        def read() -> pb.ReadResponse:
            return position_read.read_positions(commitlog, positions, hosts, total, MAX_READ_BYTES)

        # A position without a size is read as big as its record says: its first page.
        ranges = ((p.physical_offset, p.size or 1) for p in positions)
        return read() if _resident(commitlog, ranges) else await self.cold_reads.run(read)

    async def Tail(  # type: ignore[override]
        self, request: pb.TailRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[bytes]:
        """Serialized ``TailChunk``s, framed by hand around the commitlog's bytes (the
        service registers Tail with ``tide.server.serialized``: no copy into and out of
        a message, docs/performance.md "Target 4 for the storage, second round")."""
        store = self._store()
        chunk_bytes = request.max_chunk_bytes or self._tail_chunk_bytes
        if not 0 < chunk_bytes <= MAX_TAIL_CHUNK_BYTES:
            raise _invalid(f"max_chunk_bytes must be in 1..{MAX_TAIL_CHUNK_BYTES}")
        offset = request.offset
        if offset < 0:
            raise _invalid(f"offset must be >= 0 (got {offset})")
        max_offset = store.segments.max_offset
        if offset > max_offset:
            raise ServiceError(
                grpc.StatusCode.OUT_OF_RANGE,
                f"offset {offset} is past the commitlog max offset {max_offset}",
            )
        with self._tail_slots.slot():
            # aclosing: a cancelled stream removes its append listener at once, not at GC.
            async with contextlib.aclosing(self._tail(store, offset, chunk_bytes)) as chunks:
                async for chunk in chunks:
                    yield chunk

    async def _tail(
        self, store: MessageStore, offset: int, chunk_bytes: int
    ) -> AsyncGenerator[bytes, None]:
        """Tail's chunks (serialized) from ``offset`` on, until the service drains."""
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        arrived = asyncio.Event()

        def on_append(_: int) -> None:
            # Appends come from the loop's own thread (Append) unless an in-process
            # caller appends from another: only that one needs the thread-safe wake-up
            # (a write to the loop's self-pipe per append).
            if threading.get_ident() == loop_thread:
                arrived.set()
            else:
                loop.call_soon_threadsafe(arrived.set)

        def frame(start: int, size: int) -> tuple[bytes, bytes]:
            # max_offset: the store's when the chunk was cut (for the follower's lag).
            return tail_chunk_frame(start, size, store.segments.max_offset)

        commitlog = store.commitlog
        commitlog.add_listener(on_append)
        self._tail_wakers.add(arrived)
        last_sent_s = -TAIL_BUSY_S  # (monotonic) nothing sent yet: not busy
        try:
            while not self._draining.is_set():
                arrived.clear()
                try:
                    start, size, chunk = await read_chunk(
                        self.cold_reads,
                        commitlog,
                        offset,
                        chunk_bytes,
                        partial(commitlog.read_tail_framed, offset, chunk_bytes, frame),
                    )
                except OffsetBelowMinError as exc:
                    raise ServiceError(grpc.StatusCode.OUT_OF_RANGE, str(exc)) from exc
                if size:
                    yield chunk
                    offset = start + size
                    last_sent_s = time.monotonic()
                    continue
                await _wait_set(arrived, TAIL_IDLE_RECHECK_S)
                if time.monotonic() - last_sent_s < TAIL_BUSY_S:
                    await asyncio.sleep(TAIL_LINGER_S)  # busy: let more appends land
        finally:
            self._tail_wakers.discard(arrived)
            commitlog.remove_listener(on_append)

    async def Replicate(
        self,
        request_iterator: AsyncIterator[pb.ReplicateRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[pb.ReplicateChunk]:
        """A slave's stream (services/storage/replication/master.py)."""
        replication = self.replication
        if replication is None:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "replication is not started")
        with self._replicate_slots.slot():
            async for chunk in replication.serve(request_iterator, context):
                yield chunk

    def _check_topic_change(self) -> None:
        if self.replication is not None:
            self.replication.check_topic_change()

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.StorageStatus:
        store = self._store()
        status = store.status()
        recovery = store.recovery
        return pb.StorageStatus(
            min_offset=status.min_offset,
            max_offset=status.max_offset,
            flushed_offset=status.flushed_offset,
            committed_offset=status.committed_offset,
            segment_count=status.segment_count,
            segment_size_bytes=store.config.segment_size_bytes,
            disk_usage_ratio=status.disk_usage_ratio,
            writable=status.writable,
            flush_mode=store.config.flush_mode.value,
            store_dir=str(store.config.store_dir),
            store_host=store.config.store_host,
            recovery=recovery.summary() if recovery else "",
            recovery_truncated_bytes=store.recovery_truncated_bytes,
            topic_count=status.topic_count,
            replication=self.replication.status() if self.replication else None,
        )

    # -- topics and consumer offsets ----------------------------------------------
    async def UpsertTopic(
        self, request: pb.UpsertTopicRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.TopicConfig:
        try:
            self._check_topic_change()
            cfg = self._store().topics.upsert(convert.topic_from_pb(request.topic))
        except Exception as exc:
            _fail(exc, self._store())
        return convert.topic_to_pb(cfg)

    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.DeleteTopicResponse:
        self._check_topic_change()
        store = self._store()
        if store.topics.get(request.topic) is None:
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND, f"topic {quote(request.topic)} does not exist"
            )
        try:
            existed = store.delete_topic(request.topic)
        except Exception as exc:
            _fail(exc, store)
        return pb.DeleteTopicResponse(existed=existed)

    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ListTopicsResponse:
        topics = self._store().topics
        timestamp_ms, counter = topics.data_version
        shown = topics.list()
        if not request.include_hidden:  # system, retry and dead-letter topics
            shown = [cfg for cfg in shown if not is_hidden_topic(cfg.topic_name)]
        return pb.ListTopicsResponse(
            topics=[convert.topic_to_pb(cfg) for cfg in shown],
            data_version_timestamp_ms=timestamp_ms,
            data_version_counter=counter,
        )

    async def CommitOffset(
        self, request: pb.CommitOffsetRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.CommitOffsetResponse:
        if self.replication is not None:  # a slave's offsets are its master's copy
            self.replication.check_metadata_change("commit offsets")
        try:
            self._store().commit_consumer_offset(
                request.consumer_group, request.topic, request.queue_id, request.offset
            )
        except Exception as exc:
            _fail(exc, self._store())
        return pb.CommitOffsetResponse()

    async def GetOffset(
        self, request: pb.GetOffsetRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetOffsetResponse:
        try:
            offset = self._store().consumer_offsets.get(
                request.consumer_group, request.topic, request.queue_id
            )
        except Exception as exc:
            _fail(exc)
        return pb.GetOffsetResponse(offset=offset)

    # -- metadata: delivery progress, a slave's sync ---------------------------------
    async def SaveDeliveryProgress(
        self,
        request: pb.SaveDeliveryProgressRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.SaveDeliveryProgressResponse:
        """The master's dispatch's delayOffset.json, timer checkpoint and transaction
        check counts, written into config/ (engine/metadata_files.py) for the slaves to copy."""
        if self.replication is not None:
            self.replication.check_metadata_change("the master's dispatch saves delivery progress")
        store = self._store()
        try:
            await asyncio.to_thread(
                store.metadata.save_delivery_progress,
                request.delay_offsets_json,
                request.timer_checkpoint,
                request.transaction_checks_json,
            )
        except Exception as exc:
            _fail(exc, store)
        return pb.SaveDeliveryProgressResponse()

    async def GetMetadata(
        self, request: pb.GetMetadataRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetMetadataResponse:
        """The metadata files as they are on disk, at most METADATA_MAX_BYTES together
        (a slave's sync: replication/metadata_sync.py)."""
        if self.replication is not None:
            self.replication.check_master("a slave copies its metadata from its master")
        store = self._store()
        try:
            files = await asyncio.to_thread(store.metadata.read)
        except Exception as exc:
            _fail(exc, store)
        return pb.GetMetadataResponse(
            files=[pb.MetadataFile(name=name, content=content) for name, content in files]
        )

    # -- users and ACLs (issue 22): services/storage/auth_rpc.py ----------------------
    async def GetAuth(
        self, request: pb.GetAuthRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetAuthResponse:
        return auth_rpc.get_auth(self._store().auth)

    async def ChangeAuth(
        self, request: pb.ChangeAuthRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ChangeAuthResponse:
        self._check_master("change users and ACLs on the master (tide user / tide acl)")
        store = self._store()
        await asyncio.to_thread(auth_rpc.change_auth, store.auth, request)
        return pb.ChangeAuthResponse()

    # -- consumer group configs -----------------------------------------------------
    def _check_group_change(self) -> None:
        self._check_master("change group configs on the master")

    def _check_master(self, what_to_do: str) -> None:
        """FAILED_PRECONDITION on a slave, saying ``what_to_do`` instead."""
        replication = self.replication
        if replication is not None and replication.slave is not None:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this storage is a slave of {replication.settings.master_address}; {what_to_do}",
            )

    async def UpsertGroup(
        self, request: pb.UpsertGroupRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GroupConfig:
        self._check_group_change()
        store = self._store()
        try:
            groups = store.groups
            existing = groups.get(request.group.group_name)
            cfg = groups.upsert(convert.group_from_pb(request.group, existing))
        except Exception as exc:
            _fail(exc, store)
        return convert.group_to_pb(cfg)

    async def GetGroup(
        self, request: pb.GetGroupRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetGroupResponse:
        _check_group_name(request.group)
        try:
            cfg, found = self._store().groups.get_or_default(request.group)
        except Exception as exc:
            _fail(exc)
        return pb.GetGroupResponse(found=found, group=convert.group_to_pb(cfg))

    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ListGroupsResponse:
        store = self._store()
        groups = store.groups.list()
        offset_groups: list[str] = []
        if request.offsets_topic:
            committed = store.consumer_offsets.committed()
            offset_groups = sorted({g for t, g in committed if t == request.offsets_topic})
        return pb.ListGroupsResponse(
            groups=[convert.group_to_pb(cfg) for cfg in groups], offset_groups=offset_groups
        )

    async def DeleteGroup(
        self, request: pb.DeleteGroupRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.DeleteGroupResponse:
        self._check_group_change()
        _check_group_name(request.group)
        store = self._store()
        try:
            existed = store.groups.delete(request.group)
        except Exception as exc:
            _fail(exc, store)
        return pb.DeleteGroupResponse(existed=existed)

    # -- consumer group membership -------------------------------------------------
    async def ConsumerHeartbeat(
        self,
        request: pb.ConsumerHeartbeatRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.ConsumerHeartbeatResponse:
        subscriptions = [Subscription(s.topic, s.expression) for s in request.subscriptions]
        try:
            self._consumers.heartbeat(request.consumer_group, request.client_id, subscriptions)
            if self.replication is None or self.replication.slave is None:
                store = self._store()
                ensure_retry_topic(store, request.consumer_group)
        except Exception as exc:
            _fail(exc)
        return pb.ConsumerHeartbeatResponse(expiry_ms=self._consumers.expiry_ms)

    async def UnregisterConsumer(
        self,
        request: pb.UnregisterConsumerRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.UnregisterConsumerResponse:
        try:
            existed = self._consumers.unregister(request.consumer_group, request.client_id)
        except Exception as exc:
            _fail(exc)
        return pb.UnregisterConsumerResponse(existed=existed)

    async def GetConsumers(
        self, request: pb.GetConsumersRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetConsumersResponse:
        try:
            members = self._consumers.members(request.consumer_group)
        except Exception as exc:
            _fail(exc)
        return pb.GetConsumersResponse(members=[_member_pb(m) for m in members])

    # -- queue locks (fifo, issue 19) ------------------------------------------------
    def _check_lock_request(self, request: pb.QueueLockRequest) -> list[tuple[str, int]]:
        self._check_master("queue locks are held by the master")
        _check_group_name(request.consumer_group, "consumer_group")
        if not request.client_id:
            raise _invalid("client_id is empty: name the consumer group member locking")
        return [(queue.topic, queue.queue_id) for queue in request.queues]

    async def LockQueues(
        self, request: pb.QueueLockRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.QueueLockResponse:
        queues = self._check_lock_request(request)
        try:
            locked = self.queue_locks.lock(request.consumer_group, request.client_id, queues)
        except TooManyLocks as exc:
            raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from exc
        return pb.QueueLockResponse(
            locked=[pb.LockedQueue(topic=topic, queue_id=queue_id) for topic, queue_id in locked],
            max_live_ms=self.queue_locks.max_live_ms,
        )

    async def UnlockQueues(
        self, request: pb.QueueLockRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.QueueUnlockResponse:
        queues = self._check_lock_request(request)
        released = self.queue_locks.unlock(request.consumer_group, request.client_id, queues)
        return pb.QueueUnlockResponse(released=released)

    async def GetQueueLocks(
        self, request: pb.GetQueueLocksRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetQueueLocksResponse:
        _check_group_name(request.consumer_group)
        locks = self.queue_locks.locks(request.consumer_group, request.topic)
        return pb.GetQueueLocksResponse(
            locks=[
                pb.QueueLock(
                    topic=lock.topic,
                    queue_id=lock.queue_id,
                    client_id=lock.client_id,
                    expires_in_ms=lock.expires_in_ms,
                )
                for lock in locks
            ],
            in_grace=self.queue_locks.in_grace(),
        )


def _check_group_name(group: str, field: str = "group") -> None:
    error = consumer_group_error(group)
    if error is not None:
        raise _invalid(f"{field}: {error}")


def _member_pb(member: Member) -> pb.ConsumerMember:
    return pb.ConsumerMember(
        client_id=member.client_id,
        subscriptions=[
            pb.Subscription(topic=s.topic, expression=s.expression) for s in member.subscriptions
        ],
        last_heartbeat_ms=member.last_heartbeat_ms,
    )


def _resident(commitlog: CommitLog, ranges: Iterable[tuple[int, int]]) -> bool:
    """Whether every (offset, size) range's readable bytes are in memory. One check over
    the bytes covering them all when those are at most a Read's own bound (a check costs
    ~3 us: one per range of a Read of 1,024 positions would hold the loop ~3 ms); one per
    range when they lie further apart. A page between two ranges that is not in memory
    sends the read to a cold reader too: the answer is the same, only read off the loop."""
    wanted = list(ranges)
    if not wanted:
        return True
    start = min(offset for offset, _ in wanted)
    end = max(offset + size for offset, size in wanted)
    if end - start <= MAX_READ_BYTES:
        return commitlog.resident(start, end - start)
    return all(commitlog.resident(offset, size) for offset, size in wanted)

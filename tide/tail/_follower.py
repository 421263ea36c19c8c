"""TailFollower: follows a storage service's commitlog over ``tide.v1.Storage/Tail``.

One gRPC channel per connection attempt (with its own subchannel pool, so a new attempt
really reconnects instead of waiting out gRPC's reconnect backoff). When the stream fails
with a transient status (UNAVAILABLE, CANCELLED by the server, ABORTED,
DEADLINE_EXCEEDED) or ends (the server drains Tail streams when it stops), the follower
reconnects from :attr:`TailFollower.next_offset` after an exponential backoff. Bytes of a
record that had not fully arrived are dropped and asked for again, so every record is
delivered exactly once, in offset order.

OUT_OF_RANGE is never retried (:class:`TailOutOfRangeError`); other statuses raise
:class:`TailRpcError`; invalid bytes raise the assembler's errors.

Chunks are read off the wire by :func:`parse_tail_chunk`, not the generated message
class: the commitlog bytes stay where they were received, and the batches point into the
received message itself (``RecordAssembler.feed_chunk``; a record begun in the previous
chunk comes as a batch of its own). The message class copies them into the message, then
out again on each access to ``data``: with 2 MiB chunks that was ~5 % of a replay's CPU;
a copy per chunk (to join the carried-over record with the chunk) was another 2 MiB to
allocate, and to fault in, per chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from types import TracebackType
from typing import Any, NamedTuple

import grpc

from tide.format import FIXED_BYTES_V4
from tide.tail._assembler import DEFAULT_MAX_RECORD_BYTES, RecordAssembler
from tide.tail._backoff import Backoff
from tide.tail._batch import RecordAt, RecordBatch
from tide.tail._errors import (
    TailError,
    TailOutOfRangeError,
    TailRpcError,
    TailUnavailableError,
)
from tide.v1 import storage_pb2 as pb

log = logging.getLogger("tide.tail")

# The storage service's limit on TailRequest.max_chunk_bytes.
MAX_CHUNK_BYTES = 4 * 1024 * 1024
# An attempt open this long (or that delivered a chunk) was healthy: the count of
# consecutive failures starts again. Longer than the connect timeout below, so attempts
# that never connect cannot pass for healthy.
HEALTHY_STREAM_S = 10.0
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    # A 4 MiB chunk plus framing is over gRPC's 4 MiB receive default.
    ("grpc.max_receive_message_length", MAX_CHUNK_BYTES + 64 * 1024),
    # A fresh channel must not inherit a shared subchannel's reconnect backoff.
    ("grpc.use_local_subchannel_pool", 1),
    # Also gRPC's connect timeout: a silent (blackholed) server fails an attempt in 5 s.
    ("grpc.min_reconnect_backoff_ms", 5000),
)

ChannelFactory = Callable[[str], grpc.aio.Channel]
TAIL_METHOD = "/tide.v1.Storage/Tail"


class TailChunkView(NamedTuple):
    """A ``tide.v1.TailChunk``; ``data`` is a view of the received message: ``raw`` from
    ``start`` on."""

    offset: int
    data: memoryview
    max_offset: int
    raw: bytes
    start: int


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``buf[pos]`` and the position after it."""
    result = shift = 0
    while shift < 70:
        byte = buf[pos]  # IndexError when truncated
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise ValueError("TailChunk: a varint longer than 10 bytes")


def parse_tail_chunk(raw: bytes) -> TailChunkView:
    """``TailChunk.FromString(raw)`` without copying ``data`` (protobuf wire format, read
    as the generated class reads it: fields in any order, the last of a field wins, and
    unknown fields, or known ones with another wire type, are skipped)."""
    offset = max_offset = start = 0
    data = memoryview(b"")
    view = memoryview(raw)
    pos, end = 0, len(raw)
    try:
        while pos < end:
            key, pos = _varint(raw, pos)
            number, wire_type = key >> 3, key & 7
            if wire_type == 0:
                value, pos = _varint(raw, pos)
                value -= (value >> 63) << 64  # int64: two's complement
                if number == 1:
                    offset = value
                elif number == 3:
                    max_offset = value
            elif wire_type == 2:
                length, pos = _varint(raw, pos)
                if number == 2:
                    data = view[pos : pos + length]
                    start = pos
                pos += length
            elif wire_type in (1, 5):
                pos += 8 if wire_type == 1 else 4
            else:
                raise ValueError(f"TailChunk: unsupported wire type {wire_type}")
    except IndexError:
        raise ValueError("TailChunk: truncated message") from None
    if pos != end:
        raise ValueError("TailChunk: truncated message")
    return TailChunkView(offset, data, max_offset, raw, start)


def insecure_channel(target: str) -> grpc.aio.Channel:
    """The default channel factory: plaintext, with :data:`CHANNEL_OPTIONS` (the services
    pass their own: TLS and the cluster secret, tide.tls.internal_channel)."""
    return grpc.aio.insecure_channel(target, options=list(CHANNEL_OPTIONS))


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class TailFollower:
    """``async for batch in follower.records()``: lists of :class:`RecordAt`, one list per
    chunk that completed at least one record, from ``offset`` on, forever (or
    ``follower.batches()``: the same as :class:`RecordBatch` objects).

    ``max_consecutive_failures`` (default: retry forever) bounds the attempts in a row
    that end (with an error, or by the server ending the stream) before delivering a
    chunk and within ``healthy_stream_s`` of their start; once reached,
    :class:`TailUnavailableError` is raised. ``close()`` (or leaving ``async with``) ends
    the iteration cleanly, from any task.
    """

    def __init__(
        self,
        target: str,
        offset: int,
        *,
        max_chunk_bytes: int = 0,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        check_crc: bool = True,
        max_consecutive_failures: int | None = None,
        backoff: Backoff | None = None,
        channel_factory: ChannelFactory = insecure_channel,
        healthy_stream_s: float = HEALTHY_STREAM_S,
    ) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0 (got {offset})")
        if not 0 <= max_chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"max_chunk_bytes must be in 0..{MAX_CHUNK_BYTES} (0: server default)")
        if max_consecutive_failures is not None and max_consecutive_failures < 1:
            raise ValueError("max_consecutive_failures must be >= 1 (or None: retry forever)")
        if max_record_bytes < FIXED_BYTES_V4:
            raise ValueError(f"max_record_bytes must be >= {FIXED_BYTES_V4}")
        if healthy_stream_s <= 0:
            raise ValueError(f"healthy_stream_s must be > 0 (got {healthy_stream_s})")
        self.target = target
        self._max_chunk_bytes = max_chunk_bytes
        self._max_record_bytes = max_record_bytes
        self._check_crc = check_crc
        self._max_failures = max_consecutive_failures
        self._backoff = backoff if backoff is not None else Backoff()
        self._channel_factory = channel_factory
        self._healthy_stream_s = healthy_stream_s
        self._next_offset = offset
        self._max_offset: int | None = None
        self._failures = 0
        self._reconnects = 0
        self._closed = asyncio.Event()
        self._iterating = False
        self._channel: grpc.aio.Channel | None = None
        self._call: grpc.aio.UnaryStreamCall[pb.TailRequest, TailChunkView] | None = None

    # -- state -------------------------------------------------------------------
    @property
    def next_offset(self) -> int:
        """Where the records delivered so far end: resume (or persist progress) here."""
        return self._next_offset

    @property
    def max_offset(self) -> int | None:
        """The store's max offset when the last chunk was cut (None before the first)."""
        return self._max_offset

    @property
    def lag_bytes(self) -> int | None:
        """``max_offset - next_offset`` as of the last chunk (None before the first)."""
        if self._max_offset is None:
            return None
        return max(0, self._max_offset - self._next_offset)

    @property
    def reconnects(self) -> int:
        """How many times the follower has reconnected."""
        return self._reconnects

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # -- lifecycle ---------------------------------------------------------------
    async def close(self) -> None:
        """Stop following: the current stream is cancelled and ``records()`` ends."""
        self._closed.set()
        call = self._call
        if call is not None:
            call.cancel()
        await self._close_channel(self._channel)

    async def __aenter__(self) -> TailFollower:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _close_channel(self, channel: grpc.aio.Channel | None) -> None:
        if channel is None or channel is not self._channel:
            return  # already closed by whoever cleared self._channel
        self._channel = None
        await channel.close(None)

    # -- following ---------------------------------------------------------------
    async def records(self) -> AsyncGenerator[list[RecordAt], None]:
        """Batches of records in offset order; ends only on close() (or raises).

        One iteration at a time. A consumer that stops early should close the follower
        (or iterate under ``contextlib.aclosing``) so the stream is released at once.
        """
        async with contextlib.aclosing(self.batches()) as batches:
            async for batch in batches:
                yield batch.records()

    async def batches(self) -> AsyncGenerator[RecordBatch, None]:
        """:meth:`records`, each chunk's records as one column-wise :class:`RecordBatch`
        (never empty)."""
        if self._iterating:
            raise RuntimeError("records() is already being iterated")
        self._iterating = True
        try:
            while not self._closed.is_set():
                async with contextlib.aclosing(self._attempt()) as attempt:
                    async for batch in attempt:
                        yield batch
        finally:
            self._iterating = False

    async def _attempt(self) -> AsyncGenerator[RecordBatch, None]:
        """One connection: stream until it fails or ends, then wait out the backoff."""
        started = time.monotonic()
        error: grpc.aio.AioRpcError | None = None
        try:
            async with contextlib.aclosing(self._stream()) as stream:
                async for batch in stream:
                    yield batch
            reason = "the server ended the stream (stopping?)"
        except grpc.aio.AioRpcError as exc:
            if self._closed.is_set():
                return
            reason = self._retry_reason(exc)
            error = exc
        except asyncio.CancelledError:
            if self._closed.is_set() and not _being_cancelled():
                return  # close() cancelled the call
            raise
        if not self._closed.is_set():
            await self._back_off(reason, time.monotonic() - started, error)

    async def _stream(self) -> AsyncGenerator[RecordBatch, None]:
        assembler = RecordAssembler(
            self._next_offset, max_record_bytes=self._max_record_bytes, check_crc=self._check_crc
        )
        channel = self._channel_factory(self.target)
        self._channel = channel
        try:
            if self._closed.is_set():
                return
            request = pb.TailRequest(
                offset=assembler.next_offset, max_chunk_bytes=self._max_chunk_bytes
            )
            tail = channel.unary_stream(
                TAIL_METHOD,
                request_serializer=pb.TailRequest.SerializeToString,
                response_deserializer=parse_tail_chunk,
            )
            self._call = call = tail(request)
            log.debug("tail of %s: following from offset %d", self.target, request.offset)
            async for chunk in call:
                if self._failures:
                    log.info(
                        "tail of %s: resumed at offset %d after %d failed attempt(s)",
                        self.target,
                        chunk.offset,
                        self._failures,
                    )
                    self._failures = 0
                self._max_offset = chunk.max_offset
                try:
                    batches = assembler.feed_chunk(
                        chunk.offset, chunk.raw, chunk.start, chunk.start + len(chunk.data)
                    )
                except TailError as exc:
                    self._next_offset = assembler.next_offset
                    if exc.batch_before:  # deliver the good records, then fail
                        yield exc.batch_before
                    raise
                for index, batch in enumerate(batches, 1):
                    # (a record carried over comes first: delivered once yielded)
                    last = index == len(batches)
                    self._next_offset = assembler.next_offset if last else batch.end_offset
                    yield batch
                self._next_offset = assembler.next_offset
        finally:
            self._call = None
            await self._close_channel(channel)

    def _retry_reason(self, exc: grpc.aio.AioRpcError) -> str:
        """The reason to log for a retryable status; raise for any other."""
        code, details = exc.code(), exc.details() or ""
        if code is grpc.StatusCode.OUT_OF_RANGE:
            raise TailOutOfRangeError(self._next_offset, details) from exc
        if code not in RETRYABLE_CODES:
            raise TailRpcError(self._next_offset, code, details) from exc
        return f"{code.name}: {details}"

    async def _back_off(
        self, reason: str, lasted_s: float, error: grpc.aio.AioRpcError | None
    ) -> None:
        if lasted_s >= self._healthy_stream_s:
            self._failures = 0
        self._failures += 1
        if self._max_failures is not None and self._failures >= self._max_failures:
            raise TailUnavailableError(self._next_offset, self._failures, reason) from error
        delay_s = self._backoff.delay_s(self._failures)
        self._reconnects += 1
        log.info(
            "tail of %s: %s; reconnecting from offset %d in %.0f ms (attempt %d)",
            self.target,
            reason,
            self._next_offset,
            delay_s * 1000,
            self._failures,
        )
        # Wake early on close(); the timeout is the normal way out.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closed.wait(), delay_s)

"""The transaction service's reads and appends (services/dispatch/transaction): halves
from the dispatch's tail cache when it holds them, else from the storage; appends over
one AppendStream; storage failures as the ServiceError its callers answer with."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import grpc

from services.dispatch.engine.consume_queue import Entry
from services.dispatch.read_through import Position, as_bytes, read_through
from services.dispatch.storage_client import APPEND_TIMEOUT_S, AppendedRun, StorageClient
from services.dispatch.tail_cache import TailCache
from tide.format import DecodedRecord, decode_record
from tide.server import ServiceError
from tide.v1 import storage_pb2 as pb

_T = TypeVar("_T")
# How long a new append stream waits for the channel to the storage to connect: a
# restarted storage is back within a reconnect backoff or two (gRPC's first is ~1 s); a
# storage that is down answers UNAVAILABLE after it, as a call made at once would.
CONNECT_WAIT_S = 5.0


async def call_storage(call: Awaitable[_T]) -> _T:
    """``call``'s answer; a storage failure as a ServiceError of its code."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise ServiceError(exc.code(), f"storage: {exc.details()}") from exc


def gone(entry: Entry) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.NOT_FOUND,
        f"the record at commitlog offset {entry.commitlog_offset} is no longer stored "
        "(retention removed it)",
    )


_CODES = {code.value[0]: code for code in grpc.StatusCode}
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)


class _WriteFailed(Exception):
    """The request was not sent: the stream had ended."""


class RunAppendStream:
    """Record runs appended over one ``Storage.AppendStream``: a request and its answer
    on an open stream cost about half a unary Append's CPU on both sides
    (docs/benchmarks.md, "AppendStream"), and a resolution is an Append. One request at a
    time (the stream answers in order); a stream that ended while idle (the storage
    restarted) is replaced before the request is sent, one that fails with a request in
    flight is dropped and the append's outcome is unknown (UNAVAILABLE or
    DEADLINE_EXCEEDED, as a unary call's; the caller reads the op queue again)."""

    def __init__(self, storage: StorageClient) -> None:
        self._storage = storage
        self._stream: Any = None
        self._lock = asyncio.Lock()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    async def append_run(self, run: bytes, count: int) -> AppendedRun:
        """StorageClient.append_run over the stream; ServiceError when it fails."""
        request = pb.AppendRequest(records=[run])
        async with self._lock:
            reused = self._stream is not None and not self._stream.done()
            if not reused:
                await self._connected()
                self._stream = self._storage.open_append_stream()
            try:
                answer = await self._exchange(request)
            except _WriteFailed:
                if not reused:
                    raise _unavailable("the append stream could not be opened") from None
                await self._connected()
                self._stream = self._storage.open_append_stream()
                try:
                    answer = await self._exchange(request)
                except _WriteFailed:
                    raise _unavailable("the append stream could not be opened") from None
        if answer.error_code:  # refused in-band: nothing was written
            code = _CODES.get(answer.error_code, grpc.StatusCode.UNKNOWN)
            raise ServiceError(code, f"storage: {answer.error_message}")
        return self._storage.appended_run(answer.response, count)

    async def _connected(self) -> None:
        """Before a new stream: the channel connected, or UNAVAILABLE after
        CONNECT_WAIT_S (the storage is down; nothing was sent). A stream opened while the
        channel waits out its reconnect backoff (the storage just restarted) would fail
        at once."""
        if not await self._storage.connected(CONNECT_WAIT_S):
            raise _unavailable(f"not connected within {CONNECT_WAIT_S:g} s")

    async def _exchange(self, request: pb.AppendRequest) -> pb.AppendStreamResponse:
        stream = self._stream
        try:
            await stream.write(request)
        except (asyncio.InvalidStateError, grpc.aio.AioRpcError) as exc:
            self._drop()
            raise _WriteFailed(str(exc)) from exc
        try:
            answer = await asyncio.wait_for(stream.read(), APPEND_TIMEOUT_S)
        except TimeoutError:
            self._drop()
            raise ServiceError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"storage: no answer to an append in {APPEND_TIMEOUT_S:g} s",
            ) from None
        except grpc.aio.AioRpcError as exc:
            self._drop()
            raise ServiceError(exc.code(), f"storage: {exc.details()}") from exc
        except BaseException:  # cancelled: the answer will not be read
            self._drop()
            raise
        if answer is _EOF:  # the storage ended the stream (shutting down)
            self._drop()
            raise _unavailable("the storage closed the append stream")
        result: pb.AppendStreamResponse = answer
        return result

    def _drop(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None


def _unavailable(what: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAVAILABLE, f"storage: {what}; retry")


class HalfStore:
    def __init__(self, storage: StorageClient, tail_cache: TailCache) -> None:
        self.storage = storage
        self._tail_cache = tail_cache
        self._appends = RunAppendStream(storage)

    def close(self) -> None:
        self._appends.close()

    async def halves(self, entries: list[Entry]) -> list[bytes | None]:
        """Each half's record: from the tail cache when it holds it (a half just written,
        the common case: no Read), the rest in one storage Read; None: no longer stored."""
        positions = [(entry.commitlog_offset, entry.size) for entry in entries]
        return await read_through(positions, self._tail_cache, as_bytes, self._read_stored)

    async def _read_stored(self, positions: list[Position]) -> list[bytes | None]:
        return await call_storage(self.storage.read_records(positions))

    async def read(self, entry: Entry) -> DecodedRecord:
        record = await call_storage(self.read_record(entry.commitlog_offset, entry.size))
        if record is None:
            raise gone(entry)
        return record

    async def append(self, run: bytes, count: int) -> AppendedRun:
        return await self._appends.append_run(run, count)

    async def read_raw(self, physical_offset: int, size: int) -> bytes | None:
        """The record's bytes, None when the storage no longer has it. Raises AioRpcError."""
        return (await self.storage.read_records([(physical_offset, size)]))[0]

    async def read_record(self, physical_offset: int, size: int) -> DecodedRecord | None:
        data = await self.read_raw(physical_offset, size)
        if data is None:
            return None
        return decode_record(data, 0, len(data), expected_offset=physical_offset)

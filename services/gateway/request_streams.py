"""Unary-like calls to one broker service over a few long-lived bidi streams
(``Storage.AppendStream``, ``Storage.ReadStream``, ``Dispatch.GetQueueEntriesStream``).

A unary call costs both sides a call's setup and teardown (~215 us of gateway CPU and
~300 us of server CPU measured on a 2-core box); a request and its response on an open
stream about half of that. The server answers each request of a stream, in order, before
reading the next (storage.proto), so a stream carries one call at a time: a call waits for
a free slot (at most ``max_streams`` per address), takes an idle stream (opening one when
none is idle), writes its request, reads its one response and puts the stream back.

The caller sees what the unary call would have given: its response, or a
``grpc.aio.AioRpcError`` with the same code and message (an in-band error), UNAVAILABLE
when the stream broke or the server ended it (shutdown), DEADLINE_EXCEEDED when no answer
came in time. A stream that failed in any way is cancelled and forgotten (its state is
unknown); a request that could not even be written to a reused stream (it had ended
meanwhile, e.g. the server restarted) is written once more to a new stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeAlias, TypeVar, cast

import grpc

from services.gateway.deadlines import Deadlines

log = logging.getLogger("tide.gateway.request_streams")

_CODES = {code.value[0]: code for code in grpc.StatusCode}
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)
Stream: TypeAlias = "grpc.aio.StreamStreamCall[Any, Any]"
Request = TypeVar("Request")
Response = TypeVar("Response")


class StreamAnswer(Protocol):
    """A stream's response message: the unary response, or an in-band error."""

    @property
    def error_code(self) -> int: ...
    @property
    def error_message(self) -> str: ...


Answer = TypeVar("Answer", bound=StreamAnswer)


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, debug_error_string=""
    )


class _WriteFailed(Exception):
    """The request was not written: the stream had ended (the server did nothing)."""

    def __init__(self, error: grpc.aio.AioRpcError) -> None:
        super().__init__(error.details())
        self.error = error


class RequestStreamPool(Generic[Request, Answer, Response]):
    """At most ``max_streams`` open calls of the stream ``method`` to one address, reused.
    ``answer_type`` deserializes the stream's responses, ``inner`` takes the unary
    response out of one; ``serialize`` the requests (None: they arrive serialized)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        address: str,
        method: str,
        answer_type: Callable[[bytes], Answer],
        inner: Callable[[Answer], Response],
        max_streams: int,
        serialize: Callable[[Request], bytes] | None = None,
    ) -> None:
        self._open_call = channel.stream_stream(
            method, request_serializer=serialize, response_deserializer=answer_type
        )
        self._address = address
        self._name = method.rsplit("/", 1)[-1]
        self._inner = inner
        self._slots = asyncio.Semaphore(max_streams)
        self._idle: list[Stream] = []
        self._closed = False
        self._deadlines = Deadlines()
        self.opened = 0  # streams opened so far (tests, logs)

    async def call(self, request: Request, timeout_s: float) -> Response:
        """The unary call's answer to ``request``; raises ``AioRpcError``. ``timeout_s``
        bounds it all: the wait for a stream, the write and the answer (deadlines.py:
        one timer for the pool's calls, not one a call)."""
        deadline = self._deadlines.start(timeout_s)
        try:
            async with self._slots:
                return await self._call(request)
        except asyncio.CancelledError:
            if deadline.timed_out():
                raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            raise
        finally:
            deadline.end()

    async def _call(self, request: Request) -> Response:
        stream, reused = self._take()
        try:
            return await self._exchange(stream, request)
        except _WriteFailed as failed:
            if not reused:
                raise failed.error from None
            log.debug("%s to %s had ended (%s): opening another", self._name, self._address, failed)
        stream, _ = self._take(fresh=True)
        try:
            return await self._exchange(stream, request)
        except _WriteFailed as failed:
            raise failed.error from None

    def close(self) -> None:
        """Cancel the idle streams; busy ones are cancelled when their answer came."""
        self._closed = True
        for stream in self._idle:
            stream.cancel()
        self._idle.clear()

    def _take(self, *, fresh: bool = False) -> tuple[Stream, bool]:
        """An open idle stream (True) or a new one (False)."""
        while self._idle and not fresh:
            stream = self._idle.pop()
            if not stream.done():
                return stream, True
        if self._closed:
            raise rpc_error(grpc.StatusCode.CANCELLED, "the gateway is closing its channels")
        self.opened += 1
        log.debug("opening %s stream %d to %s", self._name, self.opened, self._address)
        return self._open_call(None), False

    async def _exchange(self, stream: Stream, request: Request) -> Response:
        """Write ``request``, read its answer; the stream goes back to the idle ones only
        when all went well (anything else, a timeout included, cancels it)."""
        try:
            await _write(stream, request, self._name)
            answer = await stream.read()
        except BaseException:
            stream.cancel()
            raise
        if answer is _EOF:  # the server ended the stream (shutting down)
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"the server closed the {self._name}")
        if self._closed:
            stream.cancel()
        else:
            self._idle.append(stream)
        return self._response(cast(Answer, answer))

    def _response(self, answer: Answer) -> Response:
        if answer.error_code:
            code = _CODES.get(answer.error_code, grpc.StatusCode.UNKNOWN)
            raise rpc_error(code, answer.error_message)
        return self._inner(answer)


async def _write(stream: Stream, request: object, name: str) -> None:
    try:
        await stream.write(request)
    except asyncio.InvalidStateError as exc:  # the call had ended before
        raise _WriteFailed(await _ended(stream, exc, name)) from exc
    except grpc.aio.AioRpcError as exc:
        raise _WriteFailed(exc) from exc


async def _ended(stream: Stream, exc: Exception, name: str) -> grpc.aio.AioRpcError:
    """Why ``stream`` ended, as the error a call to a gone server gives."""
    code = await stream.code()
    details = await stream.details()
    if code is grpc.StatusCode.OK or code is None:
        return rpc_error(grpc.StatusCode.UNAVAILABLE, f"the server closed the {name}")
    return rpc_error(code, details or str(exc))

"""The server side of a unary call over a long-lived bidi stream (``Storage.AppendStream``,
``Storage.ReadStream``, ``Dispatch.GetQueueEntriesStream``): one request answered at a
time per stream, in order, by the unary call's own handler; a ServiceError it raises is
answered in-band (``error_code``, ``error_message``) and the stream goes on; every idle
stream ends when the service drains (shutdown).

A stream waits for its next request most of the time. Racing each read against the drain
event would cost a task per request, so the wait is left alone and :meth:`drain` cancels
the tasks of the streams waiting at that moment instead; the read then ends the stream
normally (status OK). A stream busy with a request finishes it, answers it and ends
before reading the next.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from tide.limits import request_error
from tide.server._interceptor import ServiceError
from tide.server._stream_slots import StreamSlots

log = logging.getLogger("tide.server.request_streams")

Request = TypeVar("Request")
Response = TypeVar("Response")
Answer = TypeVar("Answer")
Context = grpc.aio.ServicerContext[object, object]
# Open streams of one method (each holds one request at a time: at most a gRPC message,
# 64 MiB); a gateway opens a few per storage or dispatch (appends in flight, 4 reads).
MAX_REQUEST_STREAMS = 1024


class RequestStreams:
    """The open streams of one method whose tasks wait for a request, to end them on
    :meth:`drain`. ``name`` (e.g. ``"append"``) names the streams in the logs, ``unit``
    (e.g. ``"appends"``) their requests."""

    def __init__(
        self, name: str, unit: str = "requests", max_streams: int = MAX_REQUEST_STREAMS
    ) -> None:
        self.name = name
        self.unit = unit
        self.slots = StreamSlots(name, max_streams, "MAX_REQUEST_STREAMS")
        self.draining = False
        self._idle: set[asyncio.Task[object]] = set()

    def drain(self) -> None:
        self.draining = True
        for task in self._idle:
            task.cancel()

    async def serve(
        self,
        requests: AsyncIterator[Request],
        context: Context,
        handle: Callable[[Request, Context], Awaitable[Response]],
        answer: Callable[..., Answer],
    ) -> AsyncIterator[Answer]:
        """Answer each request of the stream in order with ``handle`` (the unary call's
        coroutine; it raises ServiceError as the unary call fails) until the caller closes
        its side or the service drains. ``answer`` is the stream's response message type
        (fields ``response``, ``error_code``, ``error_message``)."""
        task = asyncio.current_task()
        assert task is not None
        peer = context.peer()
        with self.slots.slot():
            log.info("%s stream from %s opened", self.name, peer)
            answered = 0
            try:
                while not self.draining:
                    request = await self._next(requests, task)
                    if request is None:
                        break
                    yield await _answer(handle, request, context, answer, self.name)
                    answered += 1
            finally:
                log.info(
                    "%s stream from %s ended after %d %s", self.name, peer, answered, self.unit
                )

    async def _next(
        self, requests: AsyncIterator[Request], task: asyncio.Task[object]
    ) -> Request | None:
        """The next request; None when the caller closed its side or the service drains."""
        self._idle.add(task)
        try:
            return await anext(requests)
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            if not self.draining or task.uncancel() > 0:
                raise  # the call was cancelled (the caller went away), not drained
            return None
        finally:
            self._idle.discard(task)


async def _answer(
    handle: Callable[[Request, Context], Awaitable[Response]],
    request: Request,
    context: Context,
    answer: Callable[..., Answer],
    name: str,
) -> Answer:
    try:
        error = request_error(request)  # in-band: the interceptor leaves these streams
        if error is not None:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, error)
        response = await handle(request, context)
    except ServiceError as exc:
        log.debug("%s stream request failed: %s", name, exc)
        return answer(error_code=exc.code.value[0], error_message=exc.message)
    return answer(response=response)

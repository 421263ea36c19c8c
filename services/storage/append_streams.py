"""The server side of ``Storage.AppendStream``: one append at a time per stream, errors
answered in-band, and every idle stream ended when the service drains (shutdown).

A stream waits for its next request most of the time. Racing each read against the drain
event would cost a task per request, so the wait is left alone and :meth:`drain` cancels
the tasks of the streams waiting at that moment instead; the read then ends the stream
normally (status OK). A stream busy appending finishes its request, answers it and ends
before reading the next.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from tide.server import ServiceError
from tide.v1 import storage_pb2 as pb

log = logging.getLogger("tide.storage.append_stream")

# (request, context) -> the response; raises ServiceError as Append would fail.
AppendOne = Callable[
    [pb.AppendRequest, "grpc.aio.ServicerContext[object, object]"],
    Awaitable[pb.AppendResponse],
]


class AppendStreams:
    """The open streams' tasks waiting for a request, to end them on :meth:`drain`."""

    def __init__(self) -> None:
        self.draining = False
        self._idle: set[asyncio.Task[object]] = set()

    def drain(self) -> None:
        self.draining = True
        for task in self._idle:
            task.cancel()

    async def serve(
        self,
        requests: AsyncIterator[pb.AppendRequest],
        context: grpc.aio.ServicerContext[object, object],
        append: AppendOne,
    ) -> AsyncIterator[pb.AppendStreamResponse]:
        """Answer each request of the stream in order until the caller closes its side or
        the service drains."""
        task = asyncio.current_task()
        assert task is not None
        peer = context.peer()
        log.info("append stream from %s opened", peer)
        answered = 0
        try:
            while not self.draining:
                request = await self._next(requests, task)
                if request is None:
                    break
                yield await _answer(append, request, context)
                answered += 1
        finally:
            log.info("append stream from %s ended after %d appends", peer, answered)

    async def _next(
        self, requests: AsyncIterator[pb.AppendRequest], task: asyncio.Task[object]
    ) -> pb.AppendRequest | None:
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
    append: AppendOne,
    request: pb.AppendRequest,
    context: grpc.aio.ServicerContext[object, object],
) -> pb.AppendStreamResponse:
    try:
        response = await append(request, context)
    except ServiceError as exc:
        log.debug("AppendStream request failed: %s", exc)
        return pb.AppendStreamResponse(error_code=exc.code.value[0], error_message=exc.message)
    return pb.AppendStreamResponse(response=response)

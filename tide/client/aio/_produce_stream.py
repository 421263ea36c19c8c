"""The asyncio Producer's ProduceStream (``stream=True``): the sync
tide/client/_produce_stream.py on a grpc.aio stream, on the event loop.

Same rules as the sync one (whose pure parts it uses: the in-band error, the error of a
send a broken stream left unanswered, the retry decision): requests are written in
submission order and answered in that order, so each answer completes the oldest pending
send; a request's failure comes in-band and the stream goes on; a stream that breaks
fails every send not yet answered (Unavailable ones sent again after the backoff, per
``RetryPolicy``) and the next send opens a new stream. One reader task per open stream;
no locks (one event loop).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from tide.client._errors import TideError, Unavailable
from tide.client._produce_stream import (
    CLOSE_EXTRA_S,
    answer_error,
    answers_in,
    failure_error,
    retry_wait_ms,
)
from tide.client.aio._connection import AioConnection
from tide.v1 import gateway_pb2

_log = logging.getLogger("tide.client.producer")
_END = object()  # queued by close(): half-close the stream

Response = gateway_pb2.ProduceResponse


class _Pending:
    """One send: its request, its future, what to call it in errors, attempts so far."""

    __slots__ = ("attempts", "future", "request", "what")

    def __init__(self, request: gateway_pb2.ProduceRequest, what: str) -> None:
        self.request = request
        self.future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.what = what
        self.attempts = 0

    def fail(self, error: BaseException) -> None:
        if not self.future.done():  # its awaiter may have been cancelled meanwhile
            self.future.set_exception(error)


class _Session:
    """One open stream: the requests to write, the sends to answer, the reader task."""

    def __init__(self, owner: AioProduceStream) -> None:
        self._owner = owner
        # Unbounded here: the caller's in-flight bound (max_in_flight) bounds it.
        self._requests: asyncio.Queue[object] = asyncio.Queue()
        self.pending: collections.deque[_Pending] = collections.deque()
        self.broken = False
        self.call: Any = owner.connection.stub.ProduceStream(self._written())
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _written(self) -> AsyncIterator[gateway_pb2.ProduceRequest]:
        while True:
            item = await self._requests.get()
            if item is _END:
                return
            assert isinstance(item, gateway_pb2.ProduceRequest)
            yield item

    def submit(self, pending: _Pending) -> bool:
        """Queue the send; False when the stream is broken (open another)."""
        if self.broken:
            return False
        pending.attempts += 1
        pending.request.pack_answers = True
        self.pending.append(pending)
        self._requests.put_nowait(pending.request)
        return True

    async def close(self, timeout_s: float) -> None:
        """Half-close; await the answers due (then cancel the stream)."""
        self.broken = True
        self._requests.put_nowait(_END)
        done, _ = await asyncio.wait({self.reader}, timeout=timeout_s)
        if not done:
            _log.warning("ProduceStream: answers still due after %.1f s; cancelling", timeout_s)
            self.call.cancel()
            self.reader.cancel()
            await asyncio.wait({self.reader}, timeout=timeout_s)

    async def _read(self) -> None:
        failure: Exception = Unavailable("the gateway ended the ProduceStream early")
        try:
            async for message in self.call:
                for answer in answers_in(message):
                    self._answer(self.pending.popleft(), answer)
        except grpc.RpcError as exc:
            failure = exc
        except asyncio.CancelledError:
            self._fail_pending(Unavailable("the ProduceStream was cancelled (closing)"))
            raise
        except Exception as exc:  # a bug here must not leave sends waiting forever
            _log.error("ProduceStream reader failed", exc_info=exc)
            failure = exc
        self._fail_pending(failure)

    def _answer(self, pending: _Pending, answer: gateway_pb2.ProduceStreamResponse) -> None:
        if not answer.error_code:
            if not pending.future.done():
                pending.future.set_result(answer.response)
            return
        self._owner.fail_or_retry(pending, answer_error(answer, pending.what))

    def _fail_pending(self, failure: Exception) -> None:
        self.broken = True
        left, self.pending = list(self.pending), collections.deque()
        self._requests.put_nowait(_END)  # ends the writer if it still waits
        for pending in left:
            self._owner.fail_or_retry(pending, failure_error(failure, pending.what))


class AioProduceStream:
    """Submits Produce requests on the current stream, opening one when needed; the
    in-flight bound is the caller's. Use it on one event loop."""

    def __init__(self, connection: AioConnection) -> None:
        self.connection = connection
        self._session: _Session | None = None
        self._closed = False
        # Sends waiting for their backoff: failed at once by close().
        self._retrying: dict[_Pending, tuple[asyncio.TimerHandle, Exception]] = {}

    async def send(self, request: gateway_pb2.ProduceRequest, what: str) -> Response:
        """Send on the stream; the answer, or the error Produce would have raised.
        Cancelling the caller does not take the request back once written."""
        pending = _Pending(request, what)
        self._submit(pending)
        return await pending.future

    def _submit(self, pending: _Pending) -> None:
        if self._closed:
            raise TideError("the producer is closed")
        session = self._session
        if session is not None and session.submit(pending):
            return
        session = self._session = _Session(self)  # none yet, or it broke
        session.submit(pending)

    def fail_or_retry(self, pending: _Pending, error: Exception) -> None:
        """Send again after the backoff an Unavailable send while attempts are left;
        else fail it with ``error``."""
        if pending.future.done():
            return  # its awaiter is gone: nothing to retry for
        wait_ms = retry_wait_ms(self.connection.retry, pending.attempts, error)
        if wait_ms is None:
            pending.fail(error)
            return
        loop = asyncio.get_running_loop()
        handle = loop.call_later(wait_ms / 1000, self._resubmit, pending)
        self._retrying[pending] = (handle, error)

    def _resubmit(self, pending: _Pending) -> None:
        del self._retrying[pending]
        try:
            self._submit(pending)
        except Exception as exc:  # the send's caller gets it from the future
            pending.fail(exc)

    async def close(self) -> None:
        """Half-close the stream and await its answers. Idempotent."""
        self._closed = True
        retrying, self._retrying = self._retrying, {}
        for pending, (handle, error) in retrying.items():
            handle.cancel()
            pending.fail(
                Unavailable(f"{pending.what}: the producer closed while retrying ({error})")
            )
        session, self._session = self._session, None
        if session is not None:
            await session.close(self.connection.rpc_timeout_ms / 1000 + CLOSE_EXTRA_S)

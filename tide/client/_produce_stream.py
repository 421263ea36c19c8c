"""A producer's ProduceStream: pipelined Produce requests on one open gRPC stream.

Requests are written in submission order and the gateway answers them in that order, so
each answer completes the oldest pending send. Requests ask for packed answers
(``pack_answers``): one stream message may carry the answers of several requests
(:func:`answers_in`), fewer messages for both ends to handle under load. One thread per
open stream reads the answers; gRPC's own thread writes the requests from a queue. A
request's failure comes in-band (the error Produce would have raised) and the stream goes
on; a stream that breaks fails every request not yet answered and the next request opens
a new stream.

UNAVAILABLE (in-band: every broker unreachable; or the stream's end: the gateway shut
down or could not be reached) is retried as the unary calls are, per the connection's
``RetryPolicy``: the send goes again on the current (or a new) stream after the backoff.
A gateway that shuts down answers every request it read first, so what it did not answer
was not stored; after a lost connection a retried send may be stored twice.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import grpc

from tide.client._errors import TideError, Unavailable, error_from_rpc, error_from_status
from tide.client._rpc import Connection, RetryPolicy
from tide.v1 import gateway_pb2

_log = logging.getLogger("tide.client.producer")

_CODES = {code.value[0]: code for code in grpc.StatusCode}
_END = object()  # queued by close(): half-close the stream
# Closing waits this long beyond the RPC timeout for the answers still due.
CLOSE_EXTRA_S = 5.0

Response = gateway_pb2.ProduceResponse


def answer_error(answer: gateway_pb2.ProduceStreamResponse, what: str) -> TideError:
    """The error of an in-band failed answer: the one Produce would have raised."""
    code = _CODES.get(answer.error_code, grpc.StatusCode.UNKNOWN)
    return error_from_status(code, answer.error_message, what)


def answers_in(
    message: gateway_pb2.ProduceStreamResponse,
) -> list[gateway_pb2.ProduceStreamResponse]:
    """The answers one stream message carries, in request order: its own, then those it
    packs (``next``: a gateway packs them only for requests that set pack_answers)."""
    if not message.next:
        return [message]
    return [message, *message.next]


def failure_error(failure: Exception, what: str) -> Exception:
    """The error of a send left unanswered by a stream that ended with ``failure``."""
    if isinstance(failure, grpc.RpcError):
        return error_from_rpc(failure, what)
    if isinstance(failure, TideError):
        return type(failure)(f"{what}: {failure.message}", failure.code)
    return failure


def retry_wait_ms(retry: RetryPolicy, attempts: int, error: Exception) -> int | None:
    """How long to wait before sending again a send that failed with ``error`` after
    ``attempts``; None: fail it (not Unavailable, or no attempt left)."""
    if not isinstance(error, Unavailable) or attempts >= retry.max_attempts:
        return None
    wait_ms = retry.backoff_ms(attempts)
    _log.warning(
        "%s (attempt %d of %d); retrying in %d ms", error, attempts, retry.max_attempts, wait_ms
    )
    return wait_ms


class _Pending:
    """One send: its request, its future, what to call it in errors, attempts so far."""

    __slots__ = ("attempts", "future", "request", "what")

    def __init__(self, request: gateway_pb2.ProduceRequest, what: str) -> None:
        self.request = request
        self.future: Future[Response] = Future()
        self.what = what
        self.attempts = 0


class _Session:
    """One open stream: the requests to write, the sends to answer, the reader."""

    def __init__(self, owner: ProduceStream) -> None:
        self._owner = owner
        self.requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.pending: collections.deque[_Pending] = collections.deque()
        self.lock = threading.Lock()
        self.broken = False
        # An iterator of the answers and a grpc.Call (cancel) at once.
        self.call: Any = owner.connection.stub.ProduceStream(self._requests())
        # Started after the first submit: a stream that fails at once fails that send
        # (retried) rather than refusing it.
        self.reader = threading.Thread(target=self._read, name="tide-produce-stream", daemon=True)

    def _requests(self) -> Iterator[gateway_pb2.ProduceRequest]:
        while True:
            item = self.requests.get()
            if item is _END:
                return
            assert isinstance(item, gateway_pb2.ProduceRequest)
            yield item

    def submit(self, pending: _Pending) -> bool:
        """Queue the send; False when the stream is broken (open another)."""
        with self.lock:
            if self.broken:
                return False
            pending.attempts += 1
            pending.request.pack_answers = True
            self.pending.append(pending)
            self.requests.put(pending.request)
        return True

    def close(self, timeout_s: float) -> None:
        """Half-close; wait for the answers due (then cancel the stream)."""
        with self.lock:
            self.broken = True
        self.requests.put(_END)
        self.reader.join(timeout_s)
        if self.reader.is_alive():
            _log.warning("ProduceStream: answers still due after %.1f s; cancelling", timeout_s)
            self.call.cancel()
            self.reader.join(timeout_s)

    def _read(self) -> None:
        try:
            for message in self.call:
                for answer in answers_in(message):
                    with self.lock:
                        pending = self.pending.popleft()
                    self._answer(pending, answer)
            failure: Exception = Unavailable("the gateway ended the ProduceStream early")
        except grpc.RpcError as exc:
            failure = exc
        except Exception as exc:  # a bug here must not leave sends waiting forever
            _log.error("ProduceStream reader failed", exc_info=exc)
            failure = exc
        self._fail_pending(failure)

    def _answer(self, pending: _Pending, answer: gateway_pb2.ProduceStreamResponse) -> None:
        if not answer.error_code:
            pending.future.set_result(answer.response)
            return
        self._owner.fail_or_retry(pending, answer_error(answer, pending.what))

    def _fail_pending(self, failure: Exception) -> None:
        with self.lock:
            self.broken = True
            left, self.pending = list(self.pending), collections.deque()
        self.requests.put(_END)  # ends gRPC's writer thread if it still waits
        for pending in left:
            self._owner.fail_or_retry(pending, failure_error(failure, pending.what))


class ProduceStream:
    """Submits Produce requests on the current stream, opening one when needed.
    Thread-safe; the in-flight bound is the caller's."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._closed = threading.Event()

    def submit(self, request: gateway_pb2.ProduceRequest, what: str) -> Future[Response]:
        pending = _Pending(request, what)
        self._submit(pending)
        return pending.future

    def _submit(self, pending: _Pending) -> None:
        with self._lock:
            if self._closed.is_set():
                raise TideError("the producer is closed")
            session = self._session
            if session is not None and session.submit(pending):
                return
            session = self._session = _Session(self)  # none yet, or it broke
            session.submit(pending)  # a new session takes it
            session.reader.start()

    def fail_or_retry(self, pending: _Pending, error: Exception) -> None:
        """Retry an Unavailable send after the backoff while attempts are left; else fail
        it with ``error``."""
        wait_ms = retry_wait_ms(self.connection.retry, pending.attempts, error)
        if wait_ms is None:
            pending.future.set_exception(error)
            return
        timer = threading.Timer(wait_ms / 1000, self._resubmit, (pending, error))
        timer.daemon = True
        timer.start()

    def _resubmit(self, pending: _Pending, error: Exception) -> None:
        if self._closed.is_set():
            pending.future.set_exception(
                Unavailable(f"{pending.what}: the producer closed while retrying ({error})")
            )
            return
        try:
            self._submit(pending)
        except Exception as exc:  # the send's caller gets it from the future
            pending.future.set_exception(exc)

    def close(self) -> None:
        """Half-close the stream and wait for its answers. Idempotent."""
        with self._lock:
            self._closed.set()
            session, self._session = self._session, None
        if session is not None:
            session.close(self.connection.rpc_timeout_ms / 1000 + CLOSE_EXTRA_S)

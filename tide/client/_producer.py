"""``Producer``: send messages through a gateway (sync, batch and async; the async sends
unary on a thread pool, or pipelined on one ProduceStream with ``stream=True``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from tide.auth.client import Credentials
from tide.client._accumulator import Accumulator, Limits
from tide.client._closing import Closing
from tide.client._convert import (
    from_produce_result,
    from_produce_runs,
    plain_produce_message,
    to_produce_message,
)
from tide.client._errors import InvalidArgument, TideError
from tide.client._in_flight import InFlight, message_bytes
from tide.client._produce_stream import ProduceStream
from tide.client._rpc import (
    DEFAULT_GATEWAY,
    DEFAULT_RPC_TIMEOUT_MS,
    MAX_SEND_BYTES,
    ClientTls,
    Connection,
    RetryPolicy,
)
from tide.client._transactions import (
    CheckListener,
    LocalTransaction,
    TransactionChecker,
    TransactionOutcome,
    check_producer_group,
    send_transaction,
)
from tide.client._types import Message, MessageQueue, SendResult, SendStatus
from tide.v1 import gateway_pb2

_log = logging.getLogger("tide.client.producer")

# The gateway's limit on messages in one Produce is its business; this one keeps a client's
# request (and its memory) bounded.
MAX_BATCH_MESSAGES = 1024
DEFAULT_MAX_IN_FLIGHT = 256
MAX_IN_FLIGHT_LIMIT = 65_536
DEFAULT_MAX_IN_FLIGHT_BYTES = 64 << 20
MIN_IN_FLIGHT_BYTES = 1 << 20
MAX_IN_FLIGHT_BYTES_LIMIT = 64 << 30
DEFAULT_ASYNC_THREADS = 4
MAX_ASYNC_THREADS = 64
# Accumulation of single sends (send, send_async): how long a batch waits for company,
# and how much it carries.
DEFAULT_LINGER_MS = 2
MAX_LINGER_MS = 60_000
DEFAULT_BATCH_MAX_MESSAGES = 256
DEFAULT_BATCH_MAX_BYTES = 1 << 20
MIN_BATCH_MAX_BYTES = 1 << 10
# Closing waits this long beyond the sends' own retries for their answers.
CLOSE_EXTRA_S = 5.0


class Producer(Closing):
    """Sends messages to topics through one gateway.

    ``send`` and ``send_async`` accumulate: the single messages sent from any number of
    threads share Produce calls (a batch per topic), a batch going when it holds
    ``batch_max_messages`` or ``batch_max_bytes``, or ``linger_ms`` after its first
    message, with at most ``async_threads`` calls unanswered (docs/client.md, "Batching
    and linger"), or, for ``send``'s messages, as soon as every ``send`` under way
    waits in a batch; each message's result or error is its own. ``send`` and ``send_batch``
    block until the gateway answers; ``send_async`` and ``send_batch_async`` return a
    future. Every send blocks only while ``max_in_flight`` sends (messages of
    ``send``/``send_async``, batches of ``send_batch_async``) are unfinished, or their
    messages hold ``max_in_flight_bytes`` (a larger send goes alone), for up to
    ``rpc_timeout_ms``, then ResourceExhausted. Calls are retried on UNAVAILABLE as
    ``retry`` says.

    With ``stream=True`` the accumulated calls and the ``send_batch_async`` sends are
    pipelined on one ``ProduceStream`` (much less gRPC work per send than a call each;
    the gateway processes up to 32 of them at once, in any order, so wait for each
    ``send`` or use ``send_batch`` for ordered messages); UNAVAILABLE is
    retried as for the calls, on the current or a new stream. Thread-safe; not fork-safe
    (its channel and threads stay in the parent: make one in each process after a fork).
    Close it (or use ``with``): that sends what is accumulated, waits for every answer
    and releases the channel. ``credentials`` sign every call (a gateway with
    --auth-enabled); by default TIDE_ACCESS_KEY / TIDE_SECRET_KEY when both are set.
    """

    def __init__(
        self,
        gateway: str = DEFAULT_GATEWAY,
        *,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        tls: ClientTls = False,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES,
        async_threads: int = DEFAULT_ASYNC_THREADS,
        stream: bool = False,
        producer_group: str = "",
        transaction_checker: TransactionChecker | None = None,
        linger_ms: int = DEFAULT_LINGER_MS,
        batch_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES,
        batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES,
        credentials: Credentials | None = None,
    ) -> None:
        limits = checked_limits(
            max_in_flight,
            max_in_flight_bytes,
            async_threads,
            linger_ms,
            batch_max_messages,
            batch_max_bytes,
        )
        self._connection = Connection(
            gateway, rpc_timeout_ms=rpc_timeout_ms, retry=retry, tls=tls, credentials=credentials
        )
        self._in_flight = InFlight(max_in_flight, max_in_flight_bytes)
        self._async_threads = async_threads
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._stream = ProduceStream(self._connection) if stream else None
        retry = self._connection.retry
        self._accumulator = Accumulator(
            limits,
            self._in_flight,
            self._carry,
            topic_results,
            timeout_s=rpc_timeout_ms / 1000,
            close_timeout_s=close_timeout_s(retry, rpc_timeout_ms),
        )
        if producer_group or transaction_checker is not None:
            check_producer_group(producer_group)
        self._group = producer_group
        # A checker: the group's check requests are answered while the producer is open.
        self._checks = (
            CheckListener(self._connection, producer_group, transaction_checker)
            if transaction_checker is not None
            else None
        )

    @property
    def gateway(self) -> str:
        return self._connection.gateway

    def send(
        self,
        topic: str,
        body: bytes | str,
        *,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        queue: MessageQueue | None = None,
        delay_level: int = 0,
        deliver_at_ms: int = 0,
        delay_ms: int = 0,
    ) -> SendResult:
        """Send one message; the result names its queue, queue offset and message id.

        ``delay_level``, ``deliver_at_ms`` or ``delay_ms`` (at most one) deliver it later
        (see :class:`Message`)."""
        with self._accumulator.sync_send():  # from here this caller will join a batch
            if (
                sharding_key is None
                and queue is None
                and not (tags or keys or properties or delay_level or deliver_at_ms or delay_ms)
                and not isinstance(keys, str)  # "" is refused below as any str is
            ):  # a topic and a body: no Message to build (the common send)
                if self._connection.closed:
                    raise TideError("the producer is closed")
                return self._accumulator.send(topic, plain_produce_message(topic, body))
            message = Message(
                topic,
                body,
                tags=tags,
                keys=keys,
                properties=properties or {},
                sharding_key=sharding_key,
                queue=queue,
                delay_level=delay_level,
                deliver_at_ms=deliver_at_ms,
                delay_ms=delay_ms,
            )
            if self._connection.closed:
                raise TideError("the producer is closed")
            return self._accumulator.send(topic, to_produce_message(message))

    def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """Send up to ``MAX_BATCH_MESSAGES`` messages in one call; results in order.

        A message with a sharding key or a queue goes where that says; the others of a
        topic all go to one queue, the topic's next (a batch, as in RocketMQ), and the
        next call takes the next queue. When some were written and others not, the call
        returns and the failed ones have status SEND_FAILED and an ``error``; when none was
        written, it raises.
        """
        if not messages:
            return []
        request, _, what = _request(messages)
        response = self._connection.call(self._connection.stub.Produce, request, what)
        return _results(messages, response, what)

    def send_async(
        self,
        topic: str,
        body: bytes | str,
        *,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        queue: MessageQueue | None = None,
        delay_level: int = 0,
        deliver_at_ms: int = 0,
        delay_ms: int = 0,
    ) -> Future[SendResult]:
        """Like ``send``, in the background: the future holds the result or the error
        (cancelling it before its batch goes keeps the message from being sent)."""
        message = Message(
            topic,
            body,
            tags=tags,
            keys=keys,
            properties=properties or {},
            sharding_key=sharding_key,
            queue=queue,
            delay_level=delay_level,
            deliver_at_ms=deliver_at_ms,
            delay_ms=delay_ms,
        )
        return self._accumulate(message)

    def _accumulate(self, message: Message) -> Future[SendResult]:
        if self._connection.closed:
            raise TideError("the producer is closed")
        return self._accumulator.add(message.topic, to_produce_message(message))

    def _carry(
        self, request: gateway_pb2.ProduceRequest, what: str
    ) -> Future[gateway_pb2.ProduceResponse]:
        """Send one accumulated batch: on the stream, or as a call on a thread."""
        if self._stream is not None:
            return self._stream.submit(request, what)
        executor = self._executor_or_start()
        return executor.submit(self._connection.call, self._connection.stub.Produce, request, what)

    def send_transaction(
        self, message: Message, local_transaction: LocalTransaction
    ) -> TransactionOutcome:
        """Send ``message`` as a half message, run ``local_transaction(message, half)`` and
        commit or roll back by its answer (UNKNOWN or an exception: the broker asks the
        producer group's checker later). Needs ``producer_group``."""
        return send_transaction(self._connection, self._group, message, local_transaction)

    def send_batch_async(self, messages: Sequence[Message]) -> Future[list[SendResult]]:
        """Like ``send_batch``, in the background (pipelined with ``stream=True``)."""
        if self._stream is not None:
            return self._pipelined(messages, lambda results: results)
        if not messages:
            done: Future[list[SendResult]] = Future()
            done.set_result([])
            return done
        executor = self._executor_or_start()
        size = message_bytes(messages)
        self._acquire_in_flight(size, "send_batch_async")
        try:
            future = executor.submit(self.send_batch, messages)
        except BaseException:
            self._in_flight.release(size)
            raise
        future.add_done_callback(lambda _: self._in_flight.release(size))
        return future

    def _pipelined(
        self, messages: Sequence[Message], finish: Callable[[list[SendResult]], _T]
    ) -> Future[_T]:
        """Send on the ProduceStream: the future holds ``finish(results)`` or the error."""
        assert self._stream is not None
        outer: Future[_T] = Future()
        if not messages:
            outer.set_result(finish([]))
            return outer
        request, size, what = _request(messages)  # checked before anything is sent
        if self._connection.closed:
            raise TideError("the producer is closed")
        self._acquire_in_flight(size, "send_async")
        try:
            inner = self._stream.submit(request, what)
        except BaseException:
            self._in_flight.release(size)
            raise

        def done(answered: Future[gateway_pb2.ProduceResponse]) -> None:
            self._in_flight.release(size)
            error = answered.exception()
            if error is not None:
                outer.set_exception(error)
                return
            try:
                outer.set_result(finish(_results(messages, answered.result(), what)))
            except TideError as exc:  # the caller gets it from the future
                outer.set_exception(exc)

        inner.add_done_callback(done)
        return outer

    def _acquire_in_flight(self, size_bytes: int, what: str) -> None:
        self._in_flight.acquire(size_bytes, self._connection.rpc_timeout_ms / 1000, what)

    def _executor_or_start(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._connection.closed:
                raise TideError("the producer is closed")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self._async_threads, thread_name_prefix="tide-producer"
                )
            return self._executor

    def close(self) -> None:
        """Send what is accumulated, wait for async sends to finish, then close the
        channel. Idempotent."""
        self._accumulator.close()
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        if self._stream is not None:
            self._stream.close()
        if self._checks is not None:
            self._checks.close()
        self._connection.close()


_T = TypeVar("_T")


def _request(messages: Sequence[Message]) -> tuple[gateway_pb2.ProduceRequest, int, str]:
    """The request for a batch (messages checked), its encoded size in bytes (ByteSize
    encodes the whole request: taken once) and what to call it in errors."""
    if len(messages) > MAX_BATCH_MESSAGES:
        raise InvalidArgument(
            f"a batch of {len(messages)} messages; the limit is {MAX_BATCH_MESSAGES}"
        )
    request = gateway_pb2.ProduceRequest(
        messages=[to_produce_message(m) for m in messages], compact_results=True
    )
    topics = sorted({m.topic for m in messages})
    size = request.ByteSize()
    if size > MAX_SEND_BYTES:
        raise InvalidArgument(
            f"a batch of {len(messages)} messages is {size} bytes; the gateway takes "
            f"requests up to {MAX_SEND_BYTES} bytes: split it"
        )
    return request, size, f"Produce to {', '.join(map(repr, topics))}"


def _results(
    messages: Sequence[Message], response: gateway_pb2.ProduceResponse, what: str
) -> list[SendResult]:
    return topic_results([m.topic for m in messages], response, what)


def topic_results(
    topics: Sequence[str], response: gateway_pb2.ProduceResponse, what: str
) -> list[SendResult]:
    """The results of a call whose messages went to ``topics`` (one each, in order)."""
    if response.runs:  # the compact answer the request asks for
        try:
            results = from_produce_runs(topics, response.runs)
        except TideError as exc:
            raise TideError(f"{what}: {exc}") from exc
    else:  # a gateway that predates compact results
        if len(response.results) != len(topics):
            raise TideError(
                f"{what}: the gateway answered {len(response.results)} results for "
                f"{len(topics)} messages"
            )
        results = [from_produce_result(t, r) for t, r in zip(topics, response.results, strict=True)]
    ok = SendStatus.SEND_OK
    for result in results:
        if result.status is not ok:
            _log.warning("%s: a message %s: %s", what, result.status.value, result.error)
    return results


def close_timeout_s(retry: RetryPolicy, rpc_timeout_ms: int) -> float:
    """How long closing waits for the sends' answers: their retries, and a little."""
    return retry.max_attempts * (rpc_timeout_ms + retry.max_backoff_ms) / 1000 + CLOSE_EXTRA_S


def checked_limits(
    max_in_flight: int,
    max_in_flight_bytes: int,
    async_threads: int,
    linger_ms: int,
    batch_max_messages: int,
    batch_max_bytes: int,
) -> Limits:
    """The accumulator's limits from a producer's options (both clients'), checked."""
    if not 1 <= max_in_flight <= MAX_IN_FLIGHT_LIMIT:
        raise InvalidArgument(f"max_in_flight is {max_in_flight}; give 1..{MAX_IN_FLIGHT_LIMIT}")
    if not MIN_IN_FLIGHT_BYTES <= max_in_flight_bytes <= MAX_IN_FLIGHT_BYTES_LIMIT:
        raise InvalidArgument(
            f"max_in_flight_bytes is {max_in_flight_bytes}; give "
            f"{MIN_IN_FLIGHT_BYTES}..{MAX_IN_FLIGHT_BYTES_LIMIT}"
        )
    if not 1 <= async_threads <= MAX_ASYNC_THREADS:
        raise InvalidArgument(f"async_threads is {async_threads}; give 1..{MAX_ASYNC_THREADS}")
    if not 0 <= linger_ms <= MAX_LINGER_MS:
        raise InvalidArgument(f"linger_ms is {linger_ms}; give 0..{MAX_LINGER_MS}")
    if not 1 <= batch_max_messages <= MAX_BATCH_MESSAGES:
        raise InvalidArgument(
            f"batch_max_messages is {batch_max_messages}; give 1..{MAX_BATCH_MESSAGES}"
        )
    if not MIN_BATCH_MAX_BYTES <= batch_max_bytes <= MAX_SEND_BYTES:
        raise InvalidArgument(
            f"batch_max_bytes is {batch_max_bytes}; give {MIN_BATCH_MAX_BYTES}..{MAX_SEND_BYTES}"
        )
    return Limits(linger_ms, batch_max_messages, batch_max_bytes, async_threads)

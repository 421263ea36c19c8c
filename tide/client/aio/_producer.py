"""``Producer`` of tide.client.aio: the sync Producer's accumulation, bounds and errors
on a grpc.aio channel."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Sequence
from types import TracebackType
from typing import TypedDict, TypeVar, Unpack

from tide.auth.client import Credentials
from tide.client._convert import to_produce_message
from tide.client._errors import InvalidArgument, TideError
from tide.client._in_flight import message_bytes
from tide.client._producer import (
    DEFAULT_ASYNC_THREADS,
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_MESSAGES,
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_IN_FLIGHT_BYTES,
    _request,
    _results,
    checked_limits,
    close_timeout_s,
)
from tide.client._rpc import DEFAULT_GATEWAY, DEFAULT_RPC_TIMEOUT_MS, ClientTls, RetryPolicy
from tide.client._transactions import TransactionOutcome, check_producer_group
from tide.client._types import Message, MessageQueue, SendResult
from tide.client.aio._accumulator import AioAccumulator, Delivery, withdraw_or_report
from tide.client.aio._connection import AioConnection
from tide.client.aio._in_flight import AioInFlight
from tide.client.aio._produce_stream import AioProduceStream
from tide.client.aio._transactions import (
    AioCheckListener,
    AioLocalTransaction,
    AioTransactionChecker,
    send_transaction,
)
from tide.v1 import gateway_pb2

_log = logging.getLogger("tide.client.producer")
_T = TypeVar("_T")


class SendOptions(TypedDict, total=False):
    """``send``'s keyword arguments: the fields of :class:`Message` after topic and body."""

    tags: str
    keys: Sequence[str]
    properties: dict[str, str]
    sharding_key: str | None
    queue: MessageQueue | None
    delay_level: int
    deliver_at_ms: int
    delay_ms: int


class Producer:
    """Sends messages to topics through one gateway, on the running event loop.

    The sync :class:`tide.client.Producer`'s options (same names and defaults;
    ``async_threads`` bounds the Produce calls in flight at once), batching rules and
    errors. ``send`` accumulates (per topic, ``linger_ms`` / ``batch_max_messages`` /
    ``batch_max_bytes``); every send first awaits room under ``max_in_flight`` sends and
    ``max_in_flight_bytes`` (backpressure: ResourceExhausted after ``rpc_timeout_ms``).

    Cancelling ``await send(...)`` (docs/client.md, "The asyncio client"): before the
    message's batch left, the message is withdrawn and never sent; after, its call goes
    on (no batch is cut short) and the outcome goes to the message's :class:`Delivery`,
    which :func:`cancelled_delivery` finds on the CancelledError (or on the TimeoutError
    of ``asyncio.timeout``). With ``stream=True`` the calls (accumulated batches and
    ``send_batch``) are pipelined on one ProduceStream, as the sync Producer's. Use it
    on one event loop; close it (or ``async with``)."""

    def __init__(
        self,
        gateway: str = DEFAULT_GATEWAY,
        *,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        tls: ClientTls = False,
        credentials: Credentials | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES,
        async_threads: int = DEFAULT_ASYNC_THREADS,
        linger_ms: int = DEFAULT_LINGER_MS,
        batch_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES,
        batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES,
        stream: bool = False,
        producer_group: str = "",
        transaction_checker: AioTransactionChecker | None = None,
    ) -> None:
        if producer_group or transaction_checker is not None:
            check_producer_group(producer_group)
        if transaction_checker is not None and not inspect.iscoroutinefunction(transaction_checker):
            raise InvalidArgument("transaction_checker must be a coroutine function (async def)")
        limits = checked_limits(
            max_in_flight,
            max_in_flight_bytes,
            async_threads,
            linger_ms,
            batch_max_messages,
            batch_max_bytes,
        )
        self._connection = AioConnection(
            gateway, rpc_timeout_ms=rpc_timeout_ms, retry=retry, tls=tls, credentials=credentials
        )
        self._in_flight = AioInFlight(max_in_flight, max_in_flight_bytes)
        self._timeout_s = rpc_timeout_ms / 1000
        self._close_timeout_s = close_timeout_s(self._connection.retry, rpc_timeout_ms)
        self._accumulator = AioAccumulator(
            limits, self._in_flight, self._produce, _results, timeout_s=self._timeout_s
        )
        self._stream = AioProduceStream(self._connection) if stream else None
        self._group = producer_group
        # A checker: the group's checks are answered while the producer is open (from
        # its first use on the event loop, or at once when made on one).
        self._checks = (
            AioCheckListener(self._connection, producer_group, transaction_checker)
            if transaction_checker is not None
            else None
        )
        self._start_checks()
        self._batch_calls: set[asyncio.Task[list[SendResult]]] = set()
        self._closed = False

    @property
    def gateway(self) -> str:
        return self._connection.gateway

    @property
    def in_flight(self) -> tuple[int, int]:
        """Unfinished sends and their bytes now (diagnostics, tests)."""
        return self._in_flight.state.sends, self._in_flight.state.bytes

    async def send(
        self, topic: str, body: bytes | str, **options: Unpack[SendOptions]
    ) -> SendResult:
        """Send one message (accumulated with others of its topic); the result names its
        queue, queue offset and message id; a message not written raises."""
        delivery = await self.send_async(topic, body, **options)
        return await _outcome(delivery)

    async def send_async(
        self, topic: str, body: bytes | str, **options: Unpack[SendOptions]
    ) -> Delivery:
        """Accumulate one message once there is room; the :class:`Delivery` holds its
        result or error (``delivery.cancel()`` withdraws it until its batch leaves)."""
        message = Message(topic, body, **options)
        self._check_open()
        return await self._accumulator.add(message, to_produce_message(message))

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """Send up to ``MAX_BATCH_MESSAGES`` messages in one call, as the sync
        ``send_batch`` (results in order; raises when none was written)."""
        return await _outcome(await self.send_batch_async(messages))

    async def send_batch_async(
        self, messages: Sequence[Message]
    ) -> asyncio.Future[list[SendResult]]:
        """Start ``send_batch`` once there is in-flight room (a batch counts as one send);
        the future (a task, not to be cancelled: its call is made) holds the results."""
        self._check_open()
        request, _, what = _request(messages)  # checked before anything waits
        size = message_bytes(messages)
        await self._in_flight.acquire(size, self._timeout_s, "send_batch_async")
        task = asyncio.get_running_loop().create_task(self._batch(messages, request, what))
        self._batch_calls.add(task)
        task.add_done_callback(self._batch_calls.discard)
        task.add_done_callback(lambda _: self._in_flight.release(size))
        return task

    async def _batch(
        self, messages: Sequence[Message], request: gateway_pb2.ProduceRequest, what: str
    ) -> list[SendResult]:
        if not messages:
            return []
        return _results(messages, await self._produce(request, what), what)

    async def _produce(
        self, request: gateway_pb2.ProduceRequest, what: str
    ) -> gateway_pb2.ProduceResponse:
        if self._stream is not None:
            return await self._stream.send(request, what)
        stub = self._connection.stub
        answer: gateway_pb2.ProduceResponse = await self._connection.call(
            stub.Produce, request, what
        )
        return answer

    async def send_transaction(
        self, message: Message, local_transaction: AioLocalTransaction
    ) -> TransactionOutcome:
        """Send ``message`` as a half message, await ``local_transaction(message, half)``
        (a coroutine function) and commit or roll back by its answer (UNKNOWN or an
        exception: the broker asks the producer group's checker later). Needs
        ``producer_group``."""
        self._check_open()
        return await send_transaction(self._connection, self._group, message, local_transaction)

    def _start_checks(self) -> None:
        if self._checks is not None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return  # made outside a loop: started by the first coroutine
            self._checks.start()

    def _check_open(self) -> None:
        if self._closed:
            raise TideError("the producer is closed")
        self._start_checks()

    async def close(self) -> None:
        """Send what is accumulated, await every answer (bounded by the sends' retries:
        what is unanswered then fails with Unavailable), then close the channel.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._accumulator.close(self._close_timeout_s)
        if self._batch_calls:
            await asyncio.wait(set(self._batch_calls), timeout=self._close_timeout_s)
        if self._stream is not None:
            await self._stream.close()
        if self._checks is not None:
            await self._checks.close()
        await self._connection.close()

    async def __aenter__(self) -> Producer:
        self._start_checks()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def _outcome(future: asyncio.Future[_T]) -> _T:
    """Await a send's future; when the caller is cancelled meanwhile: withdraw the send
    if it has not left, else leave it running and hang it on the CancelledError."""
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError as cancelled:
        withdraw_or_report(future, cancelled)
        raise


def cancelled_delivery(error: BaseException) -> asyncio.Future[object] | None:
    """The future of a send cancelled while its call was in flight, from the
    CancelledError (or the TimeoutError of ``asyncio.timeout`` / ``wait_for`` around it);
    None when the cancelled send had not left (the message was withdrawn: not sent)."""
    seen: BaseException | None = error
    for _ in range(4):  # the error, its cause or context: a bounded walk
        if seen is None:
            return None
        delivery = getattr(seen, "delivery", None)
        if delivery is not None:
            return delivery  # type: ignore[no-any-return]
        seen = seen.__cause__ or seen.__context__
    return None

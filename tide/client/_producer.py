"""``Producer``: send messages through a gateway (sync, batch and async)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from tide.client._convert import from_produce_result, to_produce_message
from tide.client._errors import InvalidArgument, ResourceExhausted, TideError
from tide.client._rpc import DEFAULT_GATEWAY, DEFAULT_RPC_TIMEOUT_MS, Connection, RetryPolicy
from tide.client._types import Message, MessageQueue, SendResult, SendStatus
from tide.v1 import gateway_pb2

_log = logging.getLogger("tide.client.producer")

# The gateway's limit on messages in one Produce is its business; this one keeps a client's
# request (and its memory) bounded.
MAX_BATCH_MESSAGES = 1024
DEFAULT_MAX_IN_FLIGHT = 256
MAX_IN_FLIGHT_LIMIT = 65_536
DEFAULT_ASYNC_THREADS = 4
MAX_ASYNC_THREADS = 64


class Producer:
    """Sends messages to topics through one gateway.

    ``send`` and ``send_batch`` block until the gateway answers; ``send_async`` returns a
    future and blocks only while ``max_in_flight`` async sends are unfinished (for up to
    ``rpc_timeout_ms``, then ResourceExhausted). Calls are retried on UNAVAILABLE as
    ``retry`` says. Thread-safe. Close it (or use ``with``) to release the channel.
    """

    def __init__(
        self,
        gateway: str = DEFAULT_GATEWAY,
        *,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        async_threads: int = DEFAULT_ASYNC_THREADS,
    ) -> None:
        if not 1 <= max_in_flight <= MAX_IN_FLIGHT_LIMIT:
            raise InvalidArgument(
                f"max_in_flight is {max_in_flight}; give 1..{MAX_IN_FLIGHT_LIMIT}"
            )
        if not 1 <= async_threads <= MAX_ASYNC_THREADS:
            raise InvalidArgument(f"async_threads is {async_threads}; give 1..{MAX_ASYNC_THREADS}")
        self._connection = Connection(gateway, rpc_timeout_ms=rpc_timeout_ms, retry=retry)
        self._in_flight = threading.BoundedSemaphore(max_in_flight)
        self._async_threads = async_threads
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

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
    ) -> SendResult:
        """Send one message; the result names its queue, queue offset and message id."""
        message = Message(
            topic,
            body,
            tags=tags,
            keys=keys,
            properties=properties or {},
            sharding_key=sharding_key,
            queue=queue,
        )
        result = self.send_batch([message])[0]
        if not result.written:
            raise TideError(f"send to {topic!r} failed: {result.error}")
        return result

    def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """Send up to ``MAX_BATCH_MESSAGES`` messages in one call; results in order.

        Each message is routed on its own. When some were written and others not, the call
        returns and the failed ones have status SEND_FAILED and an ``error``; when none was
        written, it raises.
        """
        if not messages:
            return []
        if len(messages) > MAX_BATCH_MESSAGES:
            raise InvalidArgument(
                f"a batch of {len(messages)} messages; the limit is {MAX_BATCH_MESSAGES}"
            )
        request = gateway_pb2.ProduceRequest(messages=[to_produce_message(m) for m in messages])
        topics = sorted({m.topic for m in messages})
        what = f"Produce to {', '.join(map(repr, topics))}"
        response = self._connection.call(self._connection.stub.Produce, request, what)
        if len(response.results) != len(messages):
            raise TideError(
                f"{what}: the gateway answered {len(response.results)} results for "
                f"{len(messages)} messages"
            )
        results = [
            from_produce_result(m.topic, r) for m, r in zip(messages, response.results, strict=True)
        ]
        for result in results:
            if result.status is not SendStatus.SEND_OK:
                _log.warning("%s: a message %s: %s", what, result.status.value, result.error)
        return results

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
    ) -> Future[SendResult]:
        """Like ``send``, in the background: the future holds the result or the error."""
        executor = self._executor_or_start()
        if not self._in_flight.acquire(timeout=self._connection.rpc_timeout_ms / 1000):
            raise ResourceExhausted(
                "send_async: max_in_flight sends are unfinished and none finished within "
                f"{self._connection.rpc_timeout_ms} ms"
            )
        try:
            future = executor.submit(
                self.send,
                topic,
                body,
                tags=tags,
                keys=keys,
                properties=properties,
                sharding_key=sharding_key,
                queue=queue,
            )
        except BaseException:
            self._in_flight.release()
            raise
        future.add_done_callback(lambda _: self._in_flight.release())
        return future

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
        """Wait for async sends to finish, then close the channel. Idempotent."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._connection.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

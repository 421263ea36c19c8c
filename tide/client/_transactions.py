"""Transactional sends: half message, local transaction, EndTransaction; the check stream.

docs/client.md, "Transactions". ``Producer.send_transaction`` stores a half message
(invisible to consumers), runs the caller's local transaction and commits or rolls back
by its answer. An answer of UNKNOWN (or an exception) leaves the half to the broker's
check-back: a producer created with a ``transaction_checker`` keeps one
TransactionChecks stream open to its gateway (a thread), calls the checker for each
half the brokers ask about and answers with EndTransaction(from_check).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from tide.client._convert import from_produce_result, to_produce_message
from tide.client._errors import FailedPrecondition, InvalidArgument, TideError
from tide.client._rpc import Connection
from tide.client._types import Message, SendResult
from tide.naming import consumer_group_error
from tide.tail import Backoff
from tide.v1 import gateway_pb2

_log = logging.getLogger("tide.client.transactions")


class TransactionResolution(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    # Not known yet: the broker asks the producer group's checker later.
    UNKNOWN = "UNKNOWN"


_TO_PROTO = {
    TransactionResolution.COMMIT: gateway_pb2.COMMIT,
    TransactionResolution.ROLLBACK: gateway_pb2.ROLLBACK,
}


@dataclass(frozen=True)
class HalfMessage:
    """A half message a check asks about (or ``tide transactions list`` shows)."""

    topic: str
    body: bytes
    properties: dict[str, str]
    unique_key: str
    transaction_id: str
    producer_group: str
    broker_name: str
    msg_id: str
    queue_offset: int
    store_timestamp_ms: int
    checks: int


@dataclass(frozen=True)
class TransactionOutcome:
    resolution: TransactionResolution
    half: SendResult
    transaction_id: str
    # The committed message (COMMIT only, once EndTransaction succeeded).
    committed: SendResult | None = None
    # Why EndTransaction failed (the check-back resolves the half then), or "".
    error: str = field(default="")


LocalTransaction = Callable[[Message, SendResult], TransactionResolution]
TransactionChecker = Callable[[HalfMessage], TransactionResolution]


def half_message(half: gateway_pb2.HalfMessage) -> HalfMessage:
    return HalfMessage(
        topic=half.topic,
        body=half.body,
        properties=dict(half.properties),
        unique_key=half.unique_key,
        transaction_id=half.transaction_id,
        producer_group=half.producer_group,
        broker_name=half.broker_name,
        msg_id=half.msg_id,
        queue_offset=half.queue_offset,
        store_timestamp_ms=half.store_timestamp_ms,
        checks=half.checks,
    )


def check_producer_group(group: str) -> None:
    error = consumer_group_error(group)
    if error:
        raise InvalidArgument(f"producer_group: {error}")


def send_transaction(
    connection: Connection, group: str, message: Message, local: LocalTransaction
) -> TransactionOutcome:
    request, what = half_request(group, message)
    response = connection.call(connection.stub.Produce, request, what)
    result, half = half_result(message, response, what)
    try:
        resolution = local(message, half)
    except Exception:  # the local transaction's outcome is unknown: the check decides
        _log.exception("local transaction %s raised; left to the check", result.transaction_id)
        resolution = TransactionResolution.UNKNOWN
    if resolution is TransactionResolution.UNKNOWN:
        return TransactionOutcome(resolution, half, result.transaction_id)
    try:
        ended = end_transaction(connection, group, result, resolution, from_check=False)
    except TideError as exc:  # RocketMQ's oneway end: the check-back resolves it
        return end_failed(resolution, half, result, exc)
    return ended_outcome(message, resolution, half, result, ended)


def half_request(group: str, message: Message) -> tuple[gateway_pb2.ProduceRequest, str]:
    """The Produce request of a half message (checked) and what to call it in errors."""
    if not group:
        raise InvalidArgument("send_transaction needs a producer_group (Producer(...))")
    if message.delay_level or message.deliver_at_ms or message.delay_ms:
        raise InvalidArgument("a transactional message cannot be delayed")
    proto = to_produce_message(message)
    proto.transactional = True
    proto.producer_group = group
    what = f"transactional send to {message.topic!r}"
    return gateway_pb2.ProduceRequest(messages=[proto]), what


def half_result(
    message: Message, response: gateway_pb2.ProduceResponse, what: str
) -> tuple[gateway_pb2.ProduceResult, SendResult]:
    """The half's result; raises when it was not written."""
    (result,) = response.results
    half = from_produce_result(message.topic, result)
    if not half.written:
        raise TideError(f"{what} failed: {half.error}")
    return result, half


def end_failed(
    resolution: TransactionResolution,
    half: SendResult,
    result: gateway_pb2.ProduceResult,
    error: TideError,
) -> TransactionOutcome:
    _log.warning("EndTransaction of %s failed (%s); left to the check", half.msg_id, error)
    return TransactionOutcome(resolution, half, result.transaction_id, error=str(error))


def ended_outcome(
    message: Message,
    resolution: TransactionResolution,
    half: SendResult,
    result: gateway_pb2.ProduceResult,
    ended: gateway_pb2.EndTransactionResponse,
) -> TransactionOutcome:
    committed = None
    if resolution is TransactionResolution.COMMIT:
        committed = from_produce_result(message.topic, ended.committed)
    return TransactionOutcome(resolution, half, result.transaction_id, committed)


def end_transaction(
    connection: Connection,
    group: str,
    half: gateway_pb2.ProduceResult | gateway_pb2.HalfMessage,
    resolution: TransactionResolution,
    *,
    from_check: bool,
) -> gateway_pb2.EndTransactionResponse:
    request = end_request(group, half, resolution, from_check=from_check)
    return connection.call(connection.stub.EndTransaction, request, "EndTransaction")


def end_request(
    group: str,
    half: gateway_pb2.ProduceResult | gateway_pb2.HalfMessage,
    resolution: TransactionResolution,
    *,
    from_check: bool,
) -> gateway_pb2.EndTransactionRequest:
    return gateway_pb2.EndTransactionRequest(
        producer_group=group,
        broker_name=half.broker_name,
        msg_id=half.msg_id,
        queue_offset=half.queue_offset,
        transaction_id=half.transaction_id,
        resolution=_TO_PROTO[resolution],
        from_check=from_check,
    )


class CheckListener:
    """The producer's TransactionChecks stream, on a thread, reopened after a failure."""

    def __init__(self, connection: Connection, group: str, checker: TransactionChecker):
        self._connection = connection
        self._group = group
        self._checker = checker
        self._stopped = threading.Event()
        self._call: Any = None  # the open stream's call (cancelled by close)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tide-tx-checks", daemon=True)
        self.answered = 0
        self._thread.start()

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        backoff = Backoff(initial_s=0.1, max_s=5.0)
        failures = 0
        while not self._stopped.is_set():
            try:
                self._listen()
                failures = 0
            except grpc.RpcError as exc:
                if self._stopped.is_set():
                    return
                failures += 1
                _log.debug("check stream ended (%s); reopening", exc)
            self._stopped.wait(backoff.delay_s(max(1, failures)))

    def _listen(self) -> None:
        request = gateway_pb2.TransactionChecksRequest(producer_group=self._group)
        call: Any = self._connection.stub.TransactionChecks(request)
        with self._lock:
            self._call = call
        if self._stopped.is_set():
            call.cancel()
        for check in call:
            self._answer(check.half)

    def _answer(self, half: gateway_pb2.HalfMessage) -> None:
        try:
            resolution = self._checker(half_message(half))
        except Exception:
            _log.exception("transaction checker raised for %s; asked again later", half.msg_id)
            return
        if resolution is TransactionResolution.UNKNOWN:
            return
        try:
            end_transaction(self._connection, self._group, half, resolution, from_check=True)
        except FailedPrecondition:  # resolved meanwhile (another producer answered)
            pass
        except TideError as exc:
            _log.warning("EndTransaction(from_check) of %s failed: %s", half.msg_id, exc)
            return
        self.answered += 1

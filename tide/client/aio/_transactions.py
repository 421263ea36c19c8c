"""Transactional sends of tide.client.aio: the sync tide/client/_transactions.py (whose
request building and outcomes it uses) with a coroutine local transaction and checker.

``send_transaction`` stores a half message, awaits the caller's local transaction and
commits or rolls back by its answer (UNKNOWN, or an exception: the broker's check-back
decides). A producer given a ``transaction_checker`` keeps one TransactionChecks stream
open (a task, reopened after a failure) and answers each check the checker resolves
with EndTransaction(from_check).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tide.client._errors import FailedPrecondition, TideError
from tide.client._transactions import (
    HalfMessage,
    TransactionOutcome,
    TransactionResolution,
    end_failed,
    end_request,
    ended_outcome,
    half_message,
    half_request,
    half_result,
)
from tide.client._types import Message, SendResult
from tide.client.aio._connection import AioConnection
from tide.tail import Backoff
from tide.v1 import gateway_pb2

_log = logging.getLogger("tide.client.transactions")

AioLocalTransaction = Callable[[Message, SendResult], Awaitable[TransactionResolution]]
AioTransactionChecker = Callable[[HalfMessage], Awaitable[TransactionResolution]]
UNKNOWN = TransactionResolution.UNKNOWN


async def send_transaction(
    connection: AioConnection, group: str, message: Message, local: AioLocalTransaction
) -> TransactionOutcome:
    request, what = half_request(group, message)
    response = await connection.call(connection.stub.Produce, request, what)
    result, half = half_result(message, response, what)
    try:
        resolution = await local(message, half)
    except Exception:  # the local transaction's outcome is unknown: the check decides
        _log.exception("local transaction %s raised; left to the check", result.transaction_id)
        resolution = UNKNOWN
    if resolution is UNKNOWN:
        return TransactionOutcome(resolution, half, result.transaction_id)
    try:
        ended = await end_transaction(connection, group, result, resolution, from_check=False)
    except TideError as exc:  # RocketMQ's oneway end: the check-back resolves it
        return end_failed(resolution, half, result, exc)
    return ended_outcome(message, resolution, half, result, ended)


async def end_transaction(
    connection: AioConnection,
    group: str,
    half: gateway_pb2.ProduceResult | gateway_pb2.HalfMessage,
    resolution: TransactionResolution,
    *,
    from_check: bool,
) -> gateway_pb2.EndTransactionResponse:
    request = end_request(group, half, resolution, from_check=from_check)
    answer: gateway_pb2.EndTransactionResponse = await connection.call(
        connection.stub.EndTransaction, request, "EndTransaction"
    )
    return answer


class AioCheckListener:
    """The producer's TransactionChecks stream, on a task, reopened after a failure."""

    def __init__(self, connection: AioConnection, group: str, checker: AioTransactionChecker):
        self._connection = connection
        self._group = group
        self._checker = checker
        self._task: asyncio.Task[None] | None = None
        self.answered = 0

    def start(self) -> None:
        """Open the stream on the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=10)

    async def _run(self) -> None:
        backoff = Backoff(initial_s=0.1, max_s=5.0)
        failures = 0
        while True:
            try:
                await self._listen()
                failures = 0
            except grpc.RpcError as exc:
                failures += 1
                _log.debug("check stream ended (%s); reopening", exc)
            await asyncio.sleep(backoff.delay_s(max(1, failures)))

    async def _listen(self) -> None:
        request = gateway_pb2.TransactionChecksRequest(producer_group=self._group)
        call: Any = self._connection.stub.TransactionChecks(request)
        try:
            async for check in call:
                await self._answer(check.half)
        finally:
            call.cancel()

    async def _answer(self, half: gateway_pb2.HalfMessage) -> None:
        try:
            resolution = await self._checker(half_message(half))
        except Exception:
            _log.exception("transaction checker raised for %s; asked again later", half.msg_id)
            return
        if resolution is UNKNOWN:
            return
        try:
            await end_transaction(self._connection, self._group, half, resolution, from_check=True)
        except FailedPrecondition:  # resolved meanwhile (another producer answered)
            pass
        except TideError as exc:
            _log.warning("EndTransaction(from_check) of %s failed: %s", half.msg_id, exc)
            return
        self.answered += 1

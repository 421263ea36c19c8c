"""The error interceptor's unary path while tracing is off (no span made current): the
handler's answer, its ServiceError as the status, an unexpected error as INTERNAL, and
the readiness refusal, as on the traced path. In-process, a fake servicer context."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from opentelemetry import trace

from tide.server import ServiceError
from tide.server._interceptor import Readiness, _Call, _wrap_handler

METHOD = "/tide.v1.TestEcho/Echo"


class FakeContext:
    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError(details)  # as grpc.aio's abort does

    def code(self) -> grpc.StatusCode | None:
        return self.aborted[0] if self.aborted else None

    def invocation_metadata(self) -> tuple[()]:
        return ()


def wrapped(behaviour: Any, readiness: Readiness | None = None) -> Any:
    handler = grpc.unary_unary_rpc_method_handler(behaviour)
    return _wrap_handler(handler, _Call(METHOD, readiness)).unary_unary


def call(behaviour: Any, request: bytes, readiness: Readiness | None = None) -> Any:
    context = FakeContext()

    async def run() -> Any:
        return await wrapped(behaviour, readiness)(request, context)

    try:
        return asyncio.run(run()), context
    except grpc.aio.AbortError:
        return None, context


def test_the_answer_comes_back_and_no_span_is_current() -> None:
    seen: list[object] = []

    async def echo(request: bytes, context: object) -> bytes:
        seen.append(trace.get_current_span())
        return request

    answer, context = call(echo, b"hi")
    assert answer == b"hi"
    assert context.aborted is None
    assert seen == [trace.INVALID_SPAN]


def test_a_service_error_becomes_its_status() -> None:
    async def fail(request: bytes, context: object) -> bytes:
        raise ServiceError(grpc.StatusCode.NOT_FOUND, "no topic orders")

    _, context = call(fail, b"")
    assert context.aborted == (grpc.StatusCode.NOT_FOUND, "no topic orders")


def test_an_unexpected_error_becomes_internal(caplog: pytest.LogCaptureFixture) -> None:
    async def crash(request: bytes, context: object) -> bytes:
        raise RuntimeError("disk on fire")

    _, context = call(crash, b"")
    assert context.aborted == (grpc.StatusCode.INTERNAL, "RuntimeError: disk on fire")
    assert f"unexpected error in {METHOD}" in caplog.text


def test_a_service_not_serving_refuses_the_call() -> None:
    ran: list[bytes] = []

    async def echo(request: bytes, context: object) -> bytes:
        ran.append(request)
        return request

    _, context = call(echo, b"hi", Readiness("tide.v1.TestEcho"))
    assert context.aborted == (grpc.StatusCode.UNAVAILABLE, "tide.v1.TestEcho is starting")
    assert ran == []

"""A test-only service run in a subprocess by test_bootstrap.py.

``python -m tests.server._echo_service --listen 127.0.0.1:0 [--start-delay-ms N]
[--stop-marker-path PATH]``. Its methods take and return raw bytes (no protobuf):

* ``Echo(x) -> x``
* ``Fail(b"CODE:message")`` raises ``ServiceError(StatusCode.CODE, message)``
* ``Crash(x)`` raises ``RuntimeError("boom: x")``
* ``Slow(b"seconds")`` logs "slow call started", sleeps, returns ``b"slept"``
* ``Stream(b"N:CODE:message")`` yields N chunks, then raises ``ServiceError`` (CODE
  ``CRASH``: ``RuntimeError``; no CODE: ends normally)
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeAlias

import grpc

from tide.server import Config, Option, ServiceError, load_config, run_service

NAME = "tide.v1.TestEcho"
OPTIONS = (
    Option("start_delay_ms", int, 500, "how long start() takes", unit="ms"),
    Option("stop_marker_path", str, None, "stop() writes this file"),
)
_log = logging.getLogger("tests.echo")
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class EchoService:
    name = NAME

    def __init__(self, config: Config) -> None:
        self._start_delay_s = config.get_int("start_delay_ms") / 1000
        self._stop_marker_path = config.get_optional_str("stop_marker_path")

    def add_to_server(self, server: grpc.aio.Server) -> None:
        methods = {
            "Echo": grpc.unary_unary_rpc_method_handler(self.echo),
            "Fail": grpc.unary_unary_rpc_method_handler(self.fail),
            "Crash": grpc.unary_unary_rpc_method_handler(self.crash),
            "Slow": grpc.unary_unary_rpc_method_handler(self.slow),
            "Stream": grpc.unary_stream_rpc_method_handler(self.stream),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(NAME, methods),))

    async def start(self, endpoint: str) -> None:
        await asyncio.sleep(self._start_delay_s)

    def drain(self) -> None:
        pass

    async def stop(self) -> None:
        if self._stop_marker_path:
            Path(self._stop_marker_path).write_text("stopped\n", encoding="utf-8")

    async def echo(self, request: bytes, context: Context) -> bytes:
        return request

    async def fail(self, request: bytes, context: Context) -> bytes:
        code, _, message = request.decode().partition(":")
        raise ServiceError(grpc.StatusCode[code], message)

    async def crash(self, request: bytes, context: Context) -> bytes:
        raise RuntimeError(f"boom: {request.decode()}")

    async def slow(self, request: bytes, context: Context) -> bytes:
        _log.info("slow call started")
        await asyncio.sleep(float(request.decode()))
        return b"slept"

    async def stream(self, request: bytes, context: Context) -> AsyncIterator[bytes]:
        count, _, failure = request.decode().partition(":")
        for i in range(int(count)):
            yield str(i).encode()
        code, _, message = failure.partition(":")
        if code == "CRASH":
            raise RuntimeError(f"stream boom: {message}")
        if code:
            raise ServiceError(grpc.StatusCode[code], message)


def main(argv: list[str]) -> None:
    config = load_config("echo", OPTIONS, argv)
    run_service(EchoService(config), config)


if __name__ == "__main__":
    main(sys.argv[1:])

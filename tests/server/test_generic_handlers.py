"""tide.server registers every service's methods as generic handlers only, never by name
(tide/server/_generic_handlers.py says why: grpc.aio's server loop waits on one future per
method registered by name for every call)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, cast

import grpc
import pytest

from tide.server._bootstrap import _add_services
from tide.server._generic_handlers import GenericHandlers
from tide.v1 import nameserver_pb2_grpc, storage_pb2_grpc

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
REFLECTION_INFO = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def _resolve(handlers: list[grpc.GenericRpcHandler[Any, Any]], method: str) -> Any:
    """The handler grpc would find for ``method``: the first generic handler's answer."""
    for handler in handlers:
        found = handler.service(_Details(method))
        if found is not None:
            return found
    return None


class _ServerByName(GenericHandlers):
    """A server that records what is registered by name (as grpc.aio's would keep it)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: list[str] = []

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, Any]
    ) -> None:
        self.by_name.append(service_name)


class _NameServerLike:
    name = "tide.v1.NameServer"

    def add_to_server(self, server: grpc.aio.Server) -> None:
        nameserver_pb2_grpc.add_NameServerServicer_to_server(
            cast(Any, nameserver_pb2_grpc.NameServerServicer)(), server
        )

    async def start(self, endpoint: str) -> None:
        pass

    def drain(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def test_a_generated_registration_keeps_its_generic_handler_and_drops_the_names() -> None:
    recorder = GenericHandlers()
    servicer = cast(Any, storage_pb2_grpc.StorageServicer)()  # its methods unused here
    storage_pb2_grpc.add_StorageServicer_to_server(servicer, recorder)
    assert len(recorder.handlers) == 1
    for method in ("Tail", "AppendStream", "Read", "GetStatus"):
        handler = _resolve(recorder.handlers, f"/tide.v1.Storage/{method}")
        assert handler is not None, method
    assert _resolve(recorder.handlers, "/tide.v1.Storage/NoSuchMethod") is None


def test_served_services_register_no_method_by_name() -> None:
    server = _ServerByName()
    asyncio.run(_add_services(server, _NameServerLike()))
    assert server.by_name == []
    assert _resolve(server.handlers, "/tide.v1.NameServer/GetTopicRoute") is not None
    assert _resolve(server.handlers, HEALTH_CHECK) is not None
    # reflection chose its asyncio servicer (it checks for a grpc.aio.Server)
    reflection = _resolve(server.handlers, REFLECTION_INFO)
    assert inspect.isasyncgenfunction(reflection.stream_stream) or inspect.iscoroutinefunction(
        reflection.stream_stream
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda handlers: handlers.add_insecure_port("127.0.0.1:0"),
        lambda handlers: handlers.add_secure_port("127.0.0.1:0", None),
        lambda handlers: asyncio.run(handlers.start()),
        lambda handlers: asyncio.run(handlers.stop(None)),
        lambda handlers: asyncio.run(handlers.wait_for_termination()),
    ],
    ids=["add_insecure_port", "add_secure_port", "start", "stop", "wait_for_termination"],
)
def test_generic_handlers_is_not_a_server(call: Any) -> None:
    with pytest.raises(TypeError, match="only records handlers"):
        call(GenericHandlers())

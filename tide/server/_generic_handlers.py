"""The services' methods registered as generic handlers only, never by name.

A generated ``add_..._to_server`` (grpcio-tools 1.85) registers its service twice: as a
generic handler and as "registered method handlers" by name. grpc.aio's server loop
(grpcio 1.85, ``AioServer._server_main_loop``) then keeps one pending request-call
future per registered method and, for every call that arrives, runs ``asyncio.wait``
over all of them (a done callback added to each and removed again) and re-arms the one
that fired. The gateway registers ~60 methods (tide.v1, RocketMQ 5, health,
reflection). In ``bench.server_methods`` a server of 62 such methods spent a median of
257 us of CPU on a unary call (245-268 over 3 rounds) against 214 us (204-247) with
the same methods as a generic handler only. With no method registered by name, the
loop waits on one future, and grpc.aio finds the method through the generic handlers
(a dict lookup per service, in the order added). ``bench.hop_ceiling``'s relays
register theirs this way too.

:class:`GenericHandlers` is what the registrations are given: a ``grpc.aio.Server``
(reflection picks its asyncio servicer by that type) that only keeps the generic
handlers, for :func:`serve` to add to the real server.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

import grpc


class GenericHandlers(grpc.aio.Server):
    """Records the generic handlers of the services registered on it; drops their
    methods registered by name (the module's docstring says why). Not a server: the
    other methods refuse."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler[Any, Any]] = []

    def add_generic_rpc_handlers(
        self, generic_rpc_handlers: Iterable[grpc.GenericRpcHandler[Any, Any]]
    ) -> None:
        self.handlers.extend(generic_rpc_handlers)

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, Any]
    ) -> None:
        """Dropped: the same methods came in the generic handler registered with them."""

    def add_insecure_port(self, address: str) -> int:
        _refuse()

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        _refuse()

    async def start(self) -> None:
        _refuse()

    async def stop(self, grace: float | None = None) -> None:
        _refuse()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        _refuse()


def _refuse() -> NoReturn:
    raise TypeError("GenericHandlers only records handlers; serve them on a grpc.aio server")

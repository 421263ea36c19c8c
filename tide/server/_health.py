"""The standard gRPC health service (grpc.health.v1.Health) for asyncio servers.

Unlike ``grpc_health.v1.health.aio.HealthServicer``, ``Watch`` streams end (after sending
NOT_SERVING, with UNAVAILABLE) when the server enters graceful shutdown, so a connected
watcher does not hold the shutdown for the whole grace period.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from tide.quoting import quote

SERVING: int = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthServicer:
    """Register with ``health_pb2_grpc.add_HealthServicer_to_server``."""

    def __init__(self) -> None:
        self._statuses: dict[str, int] = {}
        self._changed = asyncio.Condition()
        self._shutting_down = False

    async def set(self, service: str, status: int) -> None:
        """Set ``service``'s status ("" is the whole server); ignored once shutting down."""
        async with self._changed:
            if self._shutting_down:
                return
            self._statuses[service] = status
            self._changed.notify_all()

    async def enter_graceful_shutdown(self) -> None:
        """Every service becomes NOT_SERVING for good; Watch streams end."""
        async with self._changed:
            self._shutting_down = True
            for service in self._statuses:
                self._statuses[service] = NOT_SERVING
            self._changed.notify_all()

    async def Check(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        status = self._statuses.get(request.service)
        if status is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"unknown service {quote(request.service)}"
            )
        return health_pb2.HealthCheckResponse(status=status)

    async def List(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        statuses = {
            name: health_pb2.HealthCheckResponse(status=status)
            for name, status in self._statuses.items()
        }
        return health_pb2.HealthListResponse(statuses=statuses)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        last: int | None = None
        while True:
            async with self._changed:
                while (status := self._status(request.service)) == last and not self._shutting_down:
                    await self._changed.wait()
                ending = self._shutting_down
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if ending:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")

    def _status(self, service: str) -> int:
        return self._statuses.get(service, SERVICE_UNKNOWN)

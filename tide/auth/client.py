"""Signing our own clients' calls (tide.client, the CLI, tests): a gRPC client interceptor
that adds a fresh signature (tide.auth.signature) to every call's metadata."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from tide.auth.signature import signed_metadata

ACCESS_KEY_ENV = "TIDE_ACCESS_KEY"
SECRET_KEY_ENV = "TIDE_SECRET_KEY"


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)  # never printed

    @staticmethod
    def from_env() -> Credentials | None:
        """From TIDE_ACCESS_KEY and TIDE_SECRET_KEY (None unless both are set)."""
        access_key = os.environ.get(ACCESS_KEY_ENV, "")
        secret_key = os.environ.get(SECRET_KEY_ENV, "")
        if access_key and secret_key:
            return Credentials(access_key, secret_key)
        return None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return signed_metadata(self.access_key, self.secret_key)


class _Details(grpc.ClientCallDetails):
    def __init__(self, details: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = tuple(metadata)
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class SigningInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Signs every call of a sync channel (``grpc.intercept_channel``)."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def _signed(self, details: Any) -> Any:
        return _Details(details, [*(details.metadata or ()), *self._credentials.metadata()])

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._signed(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._signed(details), request)

    def intercept_stream_unary(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ) -> Any:
        return continuation(self._signed(details), requests)

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ) -> Any:
        return continuation(self._signed(details), requests)


def signed_channel(channel: grpc.Channel, credentials: Credentials | None) -> grpc.Channel:
    """``channel`` signing every call with ``credentials`` (unchanged without)."""
    if credentials is None:
        return channel
    return grpc.intercept_channel(channel, SigningInterceptor(credentials))


def _signed_details(details: Any, credentials: Credentials) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    for key, value in credentials.metadata():
        metadata.add(key, value)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class _AioUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_signed_details(details, self._credentials), request)


class _AioUnaryStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_signed_details(details, self._credentials), request)


class _AioStreamStream(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_signed_details(details, self._credentials), requests)


def aio_signing_interceptors(credentials: Credentials | None) -> list[Any]:
    """Interceptors signing every call of an asyncio channel (none without credentials)."""
    if credentials is None:
        return []
    return [
        _AioUnaryUnary(credentials),
        _AioUnaryStream(credentials),
        _AioStreamStream(credentials),
    ]

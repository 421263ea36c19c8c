"""One ``grpc.aio`` channel to a gateway, with the sync client's timeout, retries on
UNAVAILABLE, error mapping, TLS (tide/tls.py through ``tls_credentials``) and signing
(tide/auth's asyncio interceptors)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from tide.auth.client import Credentials, aio_signing_interceptors
from tide.client._errors import Unavailable, error_from_rpc
from tide.client._rpc import (
    CHANNEL_OPTIONS,
    DEFAULT_RPC_TIMEOUT_MS,
    ClientTls,
    RetryPolicy,
    check_connection,
    tls_credentials,
)
from tide.v1 import gateway_pb2_grpc

_log = logging.getLogger("tide.client")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
# A grpc.aio unary method: called with the request and a timeout, awaited for the answer.
Method = Callable[..., Awaitable[Any]]


def open_channel(
    gateway: str, tls: ClientTls = False, credentials: Credentials | None = None
) -> grpc.aio.Channel:
    """The asyncio channel of tide.client.aio (and ``tide bench``): plaintext or TLS as
    ``tls`` says, every call signed with ``credentials`` (none: unsigned)."""
    channel_credentials = tls_credentials(tls)
    interceptors = aio_signing_interceptors(credentials) or None
    options = list(CHANNEL_OPTIONS)
    if channel_credentials is None:
        return grpc.aio.insecure_channel(gateway, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(
        gateway, channel_credentials, options=options, interceptors=interceptors
    )


class AioConnection:
    """A channel and Gateway stub; ``call`` adds the timeout, retries and error mapping.

    Made outside a running event loop is fine: grpc.aio binds the channel to the loop
    of its first call (use the object on one loop)."""

    def __init__(
        self,
        gateway: str,
        *,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        tls: ClientTls = False,
        credentials: Credentials | None = None,
    ) -> None:
        """``credentials``: sign every call; by default TIDE_ACCESS_KEY / TIDE_SECRET_KEY
        when both are set (as the sync client)."""
        check_connection(gateway, rpc_timeout_ms)
        self.gateway = gateway
        self.rpc_timeout_ms = rpc_timeout_ms
        self.retry = retry or RetryPolicy()
        self.closed = False
        signer = credentials if credentials is not None else Credentials.from_env()
        self._channel = open_channel(gateway, tls, signer)
        self.stub = gateway_pb2_grpc.GatewayStub(self._channel)

    async def call(
        self,
        method: Method,
        request: Any,
        what: str,
        *,
        extra_timeout_ms: int = 0,
        retry: bool = True,
    ) -> Any:
        """Await ``method(request)``; raise a TideError naming ``what`` when it fails.
        Each attempt has ``rpc_timeout_ms + extra_timeout_ms``; cancelling the caller
        cancels the call in flight."""
        attempts = self.retry.max_attempts if retry else 1
        timeout_s = (self.rpc_timeout_ms + extra_timeout_ms) / 1000
        failures = 0
        while True:
            if self.closed:
                raise Unavailable(f"{what}: the client is closed")
            try:
                return await method(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                if self.closed and exc.code() is grpc.StatusCode.CANCELLED:
                    raise Unavailable(f"{what}: the client closed during the call") from exc
                error = error_from_rpc(exc, what)
                failures += 1
                if not isinstance(error, Unavailable) or failures >= attempts:
                    raise error from exc
                wait_ms = self.retry.backoff_ms(failures)
                _log.warning(
                    "%s (attempt %d of %d); retrying in %d ms", error, failures, attempts, wait_ms
                )
                await asyncio.sleep(wait_ms / 1000)

    async def close(self) -> None:
        """Close the channel: calls in flight end (CANCELLED, reported as Unavailable)."""
        if self.closed:
            return
        self.closed = True
        await self._channel.close(None)

"""Internal services authenticate each other with a cluster secret (acl, issue 22).

With ``--cluster-secret-file`` (the same file on every service), every channel a service
opens to another (traced_channel, the tails, registration, replication) sends the secret
as ``x-tide-cluster-secret`` metadata, and the storage, dispatch and name server refuse
a call without it (UNAUTHENTICATED, compared in constant time) before any handler runs:
a client that is not a Tide service cannot reach their RPCs at all. Health and reflection
stay open (probes). The gateway, the public front door, checks users' signatures instead.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

METADATA_KEY = "x-tide-cluster-secret"
MIN_SECRET_CHARS = 16
MAX_SECRET_CHARS = 1024
_OPEN_PREFIXES = ("/grpc.health.", "/grpc.reflection.")
REFUSAL = "this service takes calls from the cluster's own services only (cluster secret)"


class ClusterSecretError(ValueError):
    """A --cluster-secret-file that cannot be used (the message never holds the secret)."""


class _Holder:
    value: str | None = None


SECRET = _Holder()


def load_cluster_secret(path: str | None) -> None:
    """Read the secret (surrounding whitespace dropped) for every channel of this process."""
    if not path:
        SECRET.value = None
        return
    try:
        value = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ClusterSecretError(f"--cluster-secret-file {path}: {type(exc).__name__}") from None
    if not MIN_SECRET_CHARS <= len(value) <= MAX_SECRET_CHARS or not value.isprintable():
        raise ClusterSecretError(
            f"--cluster-secret-file {path}: the secret must be {MIN_SECRET_CHARS}.."
            f"{MAX_SECRET_CHARS} printable characters"
        )
    SECRET.value = value


def _with_secret(details: Any) -> Any:
    secret = SECRET.value
    if secret is None:
        return details
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add(METADATA_KEY, secret)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_secret(details), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_secret(details), request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_secret(details), requests)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_secret(details), requests)


def cluster_channel_interceptors() -> list[Any]:
    """The interceptors sending the secret (empty without one: no cost)."""
    if SECRET.value is None:
        return []
    return [_UnaryUnary(), _UnaryStream(), _StreamUnary(), _StreamStream()]


def has_secret(metadata: Any) -> bool:
    secret = SECRET.value
    if secret is None:
        return True
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str):
            return hmac.compare_digest(value.encode(), secret.encode())
    return False


_FACTORIES: dict[str, Callable[..., Any]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


async def _refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)


class ClusterSecretInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Refuses every call without the cluster secret (health and reflection excepted)."""

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_OPEN_PREFIXES):
            return handler
        if has_secret(details.invocation_metadata):
            return handler
        for kind, factory in _FACTORIES.items():
            if getattr(handler, kind) is not None:
                return factory(
                    _refuse,
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler

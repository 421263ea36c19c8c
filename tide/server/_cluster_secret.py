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

from tide._forwarding_channel import ForwardingChannel

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


def _with_secret(metadata: Any) -> Any:
    """A call's metadata with the secret added (none set: as given)."""
    secret = SECRET.value
    if secret is None:
        return metadata
    if metadata is None:
        return ((METADATA_KEY, secret),)
    added = grpc.aio.Metadata(*metadata)
    added.add(METADATA_KEY, secret)
    return added


class _SendsSecret:
    """A multicallable of :class:`SecretChannel`: each call gets the secret added to its
    metadata (given by keyword, as every caller here gives it)."""

    __slots__ = ("_multicallable",)

    def __init__(self, multicallable: Any) -> None:
        self._multicallable = multicallable

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return self._multicallable(*args, metadata=_with_secret(metadata), **kwargs)


class SecretChannel(ForwardingChannel):
    """A channel whose calls carry the cluster secret as metadata.

    Not client interceptors, which is how the secret rode before: with any interceptor
    on a channel, grpc.aio (1.85) starts each call through a task running the
    interceptor chain, and a stream whose requests are written one by one
    (``write()``, the gateway's AppendStream, ReadStream and entries streams) hands each
    request to the call through a queue, a task and an ``asyncio.wait``; an exchange on
    such a stream cost 15-45 us more than with the metadata given to the call
    (``bench.secret_channel``; docs/performance.md, "The cluster secret as call
    metadata")."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel

    def current(self) -> grpc.aio.Channel:
        return self._channel

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _SendsSecret(self._channel.unary_unary(*args, **kwargs))

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _SendsSecret(self._channel.unary_stream(*args, **kwargs))

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _SendsSecret(self._channel.stream_unary(*args, **kwargs))

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _SendsSecret(self._channel.stream_stream(*args, **kwargs))


def cluster_channel(channel: grpc.aio.Channel) -> grpc.aio.Channel:
    """``channel`` sending the secret on every call (as it is without one: no cost)."""
    if SECRET.value is None:
        return channel
    return SecretChannel(channel)


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

"""W3C trace context across our own gRPC calls.

A service opens the channels to other Tide services with :func:`insecure_channel`: while
tracing is on (a span exporter is configured), a client interceptor puts the current
span's ``traceparent`` (and ``tracestate``) into each call's metadata; the server
interceptor (``_interceptor.py``) reads it and starts the server span as its child. With
tracing off the channel is a plain one: nothing is added to any call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tide.server._cluster_secret import cluster_channel_interceptors
from tide.server._telemetry import TRACING

PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_KEYS = frozenset(PROPAGATOR.fields)


def extract_context(metadata: Iterable[tuple[str, Any]] | None) -> Context | None:
    """The remote parent carried in gRPC ``metadata`` (None when there is none)."""
    if not metadata:
        return None
    carrier = {key: value for key, value in metadata if key in _TRACE_KEYS}
    if not carrier:
        return None
    return PROPAGATOR.extract(carrier)


def trace_metadata(current: Context | None = None) -> list[tuple[str, str]]:
    """``traceparent`` / ``tracestate`` for the current span (empty when none is valid)."""
    span = trace.get_current_span(current)
    if not span.get_span_context().is_valid:
        return []
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, current if current is not None else otel_context.get_current())
    return list(carrier.items())


def _with_trace(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    extra = trace_metadata()
    if not extra:
        return details
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    for key, value in extra:
        metadata.add(key, value)
    return grpc.aio.ClientCallDetails(
        details.method,
        details.timeout,
        metadata,
        details.credentials,
        details.wait_for_ready,
    )


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(_with_trace(client_call_details), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(_with_trace(client_call_details), request)


def client_interceptors() -> list[Any]:
    """Interceptors that carry the trace context (empty while tracing is off). Unary
    requests only: the long-lived bidirectional streams (replication) are not traced."""
    if not TRACING.enabled:
        return []
    return [_UnaryUnary(), _UnaryStream()]


def traced_channel(
    target: str, options: Sequence[tuple[str, Any]] | None = None
) -> grpc.aio.Channel:
    """``grpc.aio.insecure_channel`` carrying the trace context of the calling span."""
    interceptors = client_interceptors() + cluster_channel_interceptors()
    return grpc.aio.insecure_channel(
        target,
        options=list(options) if options is not None else None,
        interceptors=interceptors or None,
    )

"""Turn handler exceptions into gRPC statuses, refuse calls until the service is started, and
record one OpenTelemetry server span per call.

* a request with a string or repeated field past its bound (tide.limits) ->
  ``INVALID_ARGUMENT`` naming the field and the limit, before the handler runs (each
  request of a request stream as it comes, except the streams that answer in-band:
  ``tide.limits.IN_BAND_STREAMS``, checked by RequestStreams).
* :class:`ServiceError` raised by a handler -> ``context.abort(code, message)``.
* any other exception -> logged with its traceback, then ``INTERNAL``.
* ``context.abort`` inside a handler, cancellation: passed through untouched.

While tracing is on, the server span continues the trace whose W3C ``traceparent`` the
caller put in the metadata (``_tracing.py``). With :class:`RpcMetrics`, every error's
status code is counted by method (nothing is recorded for a call that succeeds).

Async handlers of every kind are wrapped (coroutines and async generators; stream handlers
using ``context.write`` are coroutines). Sync handlers are passed through unchanged.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeAlias

import grpc
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from tide.limits import IN_BAND_STREAMS, request_error
from tide.server._metrics import RpcMetrics
from tide.server._telemetry import TRACING
from tide.server._tracing import extract_context

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Behaviour: TypeAlias = Callable[..., Any]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
# grpc-stubs declares the continuation's result non-optional; it is None for unknown methods.
Continuation: TypeAlias = (
    "Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]]"
)

_log = logging.getLogger("tide.server.rpc")
_tracer = trace.get_tracer("tide.server")
_UNTRACED_PREFIXES = ("grpc.health.", "grpc.reflection.")
# Request fields named on the server span when present (topic, queue, group, broker).
_REQUEST_ATTRIBUTES = (
    ("topic", "messaging.destination.name"),
    ("queue_id", "messaging.tide.queue_id"),
    ("broker_name", "messaging.tide.broker_name"),
    ("consumer_group", "messaging.consumer.group.name"),
)
_FACTORIES: dict[str, Callable[..., grpc.RpcMethodHandler[Any, Any]]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


class ServiceError(Exception):
    """Raise from a handler to end the call with ``code`` and ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        if code is grpc.StatusCode.OK:
            raise ValueError("ServiceError needs an error status code, not OK")
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class Readiness:
    """Refuses calls to ``service_name``'s methods (and those of ``more_names``, served
    on the same port) with UNAVAILABLE unless it is serving."""

    def __init__(self, service_name: str, more_names: tuple[str, ...] = ()) -> None:
        self.service_name = service_name
        self.names = (service_name, *more_names)
        self.state = "starting"
        self._prefixes = tuple(f"/{name}/" for name in self.names)

    def refusal(self, method: str) -> str | None:
        if self.state == "serving" or not method.startswith(self._prefixes):
            return None
        return f"{self.service_name} is {self.state}"


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(
        self, readiness: Readiness | None = None, rpc_metrics: RpcMetrics | None = None
    ) -> None:
        self._readiness = readiness
        self._rpc_metrics = rpc_metrics
        # method -> (handler as registered, wrapped handler): wrap once per method, not per call
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler: Handler | None = await continuation(handler_call_details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED
            return None  # type: ignore[return-value]
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _wrap_handler(handler, _Call(method, self._readiness, self._rpc_metrics))
        self._wrapped[method] = (handler, wrapped)
        return wrapped


class _Call:
    """What a wrapper needs to know about the method it wraps."""

    def __init__(
        self, method: str, readiness: Readiness | None, rpc_metrics: RpcMetrics | None = None
    ) -> None:
        self.method = method
        self.readiness = readiness
        service, _, name = method.lstrip("/").rpartition("/")
        self.span_name = method.lstrip("/")
        self.attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
        self.traced = not service.startswith(_UNTRACED_PREFIXES)
        self.metrics = rpc_metrics if self.traced else None
        self.metric_attributes = {"rpc_method": name}

    def span(self, context: Context, request: Any = None) -> Span:
        """A new server span, the child of the caller's when it sent a trace context; a
        non-recording one while tracing is off and for health and reflection calls. It
        names the request's topic, queue, broker and group when the request has them."""
        if not self.traced or not TRACING.enabled:
            return trace.INVALID_SPAN
        parent = extract_context(context.invocation_metadata())
        span = _tracer.start_span(
            self.span_name, context=parent, kind=SpanKind.SERVER, attributes=self.attributes
        )
        if request is not None and span.is_recording():
            for field, attribute in _REQUEST_ATTRIBUTES:
                value = getattr(request, field, None)
                if isinstance(value, int) or (isinstance(value, str) and value):
                    span.set_attribute(attribute, value)
        return span

    @staticmethod
    def check_request(request: Any) -> None:
        """Refuse a request with a string or repeated field past its bound (tide.limits)
        before the handler sees it."""
        error = request_error(request)
        if error is not None:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, error)

    async def checked_requests(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """A stream's requests, each checked as a unary request is; one past a bound ends
        the stream with INVALID_ARGUMENT."""
        async for request in requests:
            self.check_request(request)
            yield request

    def record_error(self, code: grpc.StatusCode) -> None:
        metrics = self.metrics
        if metrics is not None:
            metrics.errors.add(1, {**self.metric_attributes, "grpc_code": code.name})

    async def check_ready(self, context: Context) -> None:
        refusal = self.readiness.refusal(self.method) if self.readiness else None
        if refusal is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)

    async def fail(self, span: Span, context: Context, exc: Exception) -> NoReturn:
        """Abort the call for ``exc`` (re-raising aborts); always raises."""
        if isinstance(exc, grpc.aio.AbortError):
            span.set_status(Status(StatusCode.ERROR, "aborted"))
            code = context.code()
            if isinstance(code, grpc.StatusCode):
                span.set_attribute("rpc.grpc.status_code", code.value[0])
            raise exc
        if isinstance(exc, ServiceError):
            code, message = exc.code, exc.message
            _log.debug("%s failed: %s", self.method, exc)
        else:
            code, message = grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
            _log.error("unexpected error in %s", self.method, exc_info=exc)
            span.record_exception(exc)
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        span.set_status(Status(StatusCode.ERROR, message))
        await context.abort(code, message)

    def succeeded(self, span: Span) -> None:
        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.OK.value[0])


def _wrap_handler(
    handler: grpc.RpcMethodHandler[Any, Any], call: _Call
) -> grpc.RpcMethodHandler[Any, Any]:
    for kind, factory in _FACTORIES.items():
        behaviour: Behaviour | None = getattr(handler, kind)
        if behaviour is None:
            continue
        streamed = kind.startswith("stream_")
        checked = not (streamed and call.method in IN_BAND_STREAMS)  # those check in-band
        wrapped = _wrap_behaviour(behaviour, call, streamed, checked)
        if wrapped is behaviour:
            return handler
        return factory(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler


def _wrap_behaviour(behaviour: Behaviour, call: _Call, streamed: bool, checked: bool) -> Behaviour:
    """``streamed``: the method takes a stream of requests (each is checked as it comes);
    ``checked``: False for a stream whose handler checks each request (in-band)."""
    if inspect.isasyncgenfunction(behaviour):
        return _wrap_async_gen(behaviour, call, streamed, checked)
    if inspect.iscoroutinefunction(behaviour):
        return _wrap_coroutine(behaviour, call, streamed, checked)
    return behaviour


def _checked(call: _Call, request: Any, streamed: bool, checked: bool) -> Any:
    """The request checked (tide.limits), or a stream of requests checked one by one."""
    if not checked:
        return request
    if streamed:
        return call.checked_requests(request)
    call.check_request(request)
    return request


def _wrap_coroutine(behaviour: Behaviour, call: _Call, streamed: bool, checked: bool) -> Behaviour:
    async def wrapped(request: Any, context: Context) -> Any:
        span = call.span(context, None if streamed else request)
        if span is trace.INVALID_SPAN:  # tracing off: no span to make current or end
            return await _run_untraced(behaviour, call, request, context, streamed, checked)
        with trace.use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            try:
                await call.check_ready(context)
                result = await behaviour(_checked(call, request, streamed, checked), context)
            except Exception as exc:
                call.record_error(_error_code(exc, context))
                await call.fail(span, context, exc)
            call.succeeded(span)
            return result

    return wrapped


async def _run_untraced(
    behaviour: Behaviour,
    call: _Call,
    request: Any,
    context: Context,
    streamed: bool,
    checked: bool,
) -> Any:
    """A unary-answer call while it has no span (tracing off, health, reflection): the
    same checks, errors and metrics, without attaching the invalid span as the current
    one and ending it (~1.5 us a call of context-variable work that changes nothing:
    the current span is already the invalid one)."""
    try:
        await call.check_ready(context)
        return await behaviour(_checked(call, request, streamed, checked), context)
    except Exception as exc:
        call.record_error(_error_code(exc, context))
        await call.fail(trace.INVALID_SPAN, context, exc)


def _wrap_async_gen(behaviour: Behaviour, call: _Call, streamed: bool, checked: bool) -> Behaviour:
    async def wrapped(request: Any, context: Context) -> AsyncIterator[Any]:
        # No current-span context here: it would be attached and detached across yields.
        span = call.span(context, None if streamed else request)
        try:
            await call.check_ready(context)
            requests = _checked(call, request, streamed, checked)
            async with contextlib.aclosing(behaviour(requests, context)) as responses:
                async for response in responses:
                    yield response
        except Exception as exc:
            call.record_error(_error_code(exc, context))
            await call.fail(span, context, exc)
        else:
            call.succeeded(span)
        finally:
            span.end()

    return wrapped


def _error_code(exc: Exception, context: Context) -> grpc.StatusCode:
    """The status code a failed call ends with."""
    if isinstance(exc, ServiceError):
        return exc.code
    if isinstance(exc, grpc.aio.AbortError):
        code = context.code()
        return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
    return grpc.StatusCode.INTERNAL

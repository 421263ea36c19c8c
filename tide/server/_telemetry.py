"""OpenTelemetry set-up: one TracerProvider and one MeterProvider per process.

Span exporters: ``none`` (no spans are recorded at all), ``console`` (stdout), ``file``
(JSON lines appended to a path, for debugging and tests) and ``otlp``. Metric exporters:
``none``, ``console`` and ``otlp``; besides them, ``metrics_listen`` (``HOST:PORT``) serves
the metrics for Prometheus at ``http://HOST:PORT/metrics``.

``otlp`` needs ``pip install opentelemetry-exporter-otlp`` and is configured by the
standard ``OTEL_EXPORTER_OTLP_*`` environment variables. ``auto`` (what ``run_service``
passes when an exporter option was left at its default) means ``otlp`` when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and the package is installed, ``none`` otherwise.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, ExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

TRACES_EXPORTERS = ("none", "console", "file", "otlp")
METRICS_EXPORTERS = ("none", "console", "otlp")
EXPORTERS = METRICS_EXPORTERS  # kept for callers of the first version
AUTO = "auto"
OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
EXEMPLAR_FILTER_ENV = "OTEL_METRICS_EXEMPLAR_FILTER"
_OTLP_PACKAGE = "opentelemetry.exporter.otlp.proto.grpc"

_log = logging.getLogger("tide.server.telemetry")


class TelemetryError(RuntimeError):
    """An exporter that cannot be set up (unknown name, missing package, bad address)."""


class _TracingState:
    """Whether spans are recorded in this process: when not, the server interceptor skips
    reading the trace context and channels get no client interceptor (no cost at all)."""

    enabled = False


TRACING = _TracingState()


def tracing_enabled() -> bool:
    return TRACING.enabled


@dataclass(slots=True)
class Telemetry:
    service_name: str
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    # "HOST:PORT" of the Prometheus scrape endpoint (the real port when 0 was asked).
    metrics_endpoint: str | None = None
    _http_server: Any = field(default=None, repr=False)

    def shutdown(self) -> None:
        """Flush pending spans and metrics, then stop the exporters (and the endpoint)."""
        self.tracer_provider.force_flush()
        self.meter_provider.force_flush()
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
            self._http_server = None


def configure_telemetry(
    service_name: str,
    traces_exporter: str = "none",
    metrics_exporter: str = "none",
    *,
    sampler_ratio: float = 1.0,
    traces_file: str | None = None,
    metrics_listen: str | None = None,
    install_global: bool = True,
) -> Telemetry:
    """Create the providers and (by default) install them as the global ones.

    Raises :class:`TelemetryError` for an unknown exporter, a missing OTLP package, a
    ``file`` exporter without a path or a ``metrics_listen`` that cannot be bound.
    """
    traces_exporter = _resolve_auto(traces_exporter)
    metrics_exporter = _resolve_auto(metrics_exporter)
    for kind, name, allowed in (
        ("traces", traces_exporter, TRACES_EXPORTERS),
        ("metrics", metrics_exporter, METRICS_EXPORTERS),
    ):
        if name not in allowed:
            raise TelemetryError(f"{kind} exporter must be one of {', '.join(allowed)}: {name!r}")
    if not 0.0 <= sampler_ratio <= 1.0:
        raise TelemetryError(f"the traces sampler ratio must be in 0..1, got {sampler_ratio}")
    span_exporter = _span_exporter(traces_exporter, traces_file, service_name)
    readers = _readers(metrics_exporter)
    http_server = None
    endpoint = None
    if metrics_listen:
        reader, http_server, endpoint = _prometheus(metrics_listen)
        readers.append(reader)
    resource = Resource.create({SERVICE_NAME: service_name})
    # With no exporter, spans would be built and dropped on every call: sample none, so
    # they are non-recording and nearly free (the hot paths make one per RPC).
    sampler = ALWAYS_OFF if span_exporter is None else ParentBased(TraceIdRatioBased(sampler_ratio))
    tracer_provider = TracerProvider(resource=resource, sampler=sampler)
    if span_exporter is not None:
        processor = (
            SimpleSpanProcessor(span_exporter)
            if isinstance(span_exporter, JsonLinesSpanExporter)
            else BatchSpanProcessor(span_exporter)
        )
        tracer_provider.add_span_processor(processor)
    meter_provider = MeterProvider(
        resource=resource,
        metric_readers=readers,
        exemplar_filter=_exemplar_filter(span_exporter is not None),
    )
    if install_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        TRACING.enabled = span_exporter is not None and sampler_ratio > 0
    return Telemetry(service_name, tracer_provider, meter_provider, endpoint, http_server)


def _exemplar_filter(traces_exported: bool) -> ExemplarFilter | None:
    """No exemplars when no trace is exported (None: the SDK's default, trace_based, or
    what OTEL_METRICS_EXEMPLAR_FILTER names). An exemplar names a sampled span, and with
    no exporter none is sampled (ALWAYS_OFF), so the default filter would answer no for
    every measurement, after looking up the current span each time: ~4 % of the
    storage's CPU on one-message appends (docs/performance.md)."""
    if traces_exported or os.environ.get(EXEMPLAR_FILTER_ENV):
        return None
    return AlwaysOffExemplarFilter()


def _resolve_auto(name: str) -> str:
    if name != AUTO:
        return name
    if not os.environ.get(OTLP_ENDPOINT_ENV):
        return "none"
    if importlib.util.find_spec("opentelemetry.exporter.otlp") is None:
        _log.warning(
            "%s is set but the otlp exporter is not installed "
            "(pip install opentelemetry-exporter-otlp): exporting nothing",
            OTLP_ENDPOINT_ENV,
        )
        return "none"
    return "otlp"


def _span_exporter(name: str, path: str | None, service_name: str) -> SpanExporter | None:
    if name == "console":
        return ConsoleSpanExporter(out=sys.stdout)  # the stdout of now, not of import time
    if name == "file":
        if not path:
            raise TelemetryError("the file traces exporter needs --otel-traces-file PATH")
        return JsonLinesSpanExporter(path.format(service=service_name, pid=os.getpid()))
    if name == "otlp":
        exporter: SpanExporter = _otlp_class("trace_exporter", "OTLPSpanExporter")()
        return exporter
    return None


def _readers(name: str) -> list[MetricReader]:
    exporter: MetricExporter
    if name == "console":
        exporter = ConsoleMetricExporter(out=sys.stdout)
    elif name == "otlp":
        exporter = _otlp_class("metric_exporter", "OTLPMetricExporter")()
    else:
        return []
    return [PeriodicExportingMetricReader(exporter)]


def _prometheus(listen: str) -> tuple[MetricReader, Any, str]:
    """A Prometheus reader on a registry of its own, served at ``listen`` (a thread)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise TelemetryError(f"--metrics-listen: expected HOST:PORT, got {listen!r}")
    registry = CollectorRegistry(auto_describe=True)
    reader = PrometheusMetricReader(registry=registry)
    try:
        server, _thread = start_http_server(int(port_text), host.strip("[]"), registry=registry)
    except OSError as exc:
        raise TelemetryError(
            f"--metrics-listen: cannot listen on {listen}: {exc.strerror or exc}"
        ) from exc
    return reader, server, f"{host}:{server.server_port}"


def _otlp_class(module: str, name: str) -> Any:
    try:
        loaded = importlib.import_module(f"{_OTLP_PACKAGE}.{module}")
    except ImportError as exc:
        raise TelemetryError(
            f"the otlp exporter needs the {_OTLP_PACKAGE} package "
            f"({exc}); install it with: pip install opentelemetry-exporter-otlp"
        ) from exc
    return getattr(loaded, name)


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One finished span as the ``file`` exporter writes it (ids in lowercase hex)."""
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}" if ctx else "",
        "span_id": f"{ctx.span_id:016x}" if ctx else "",
        "parent_span_id": f"{parent.span_id:016x}" if parent else None,
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "service": span.resource.attributes.get(SERVICE_NAME),
        "attributes": dict(span.attributes or {}),
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to ``path`` (see :func:`span_record`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in shutdown
        except OSError as exc:
            raise TelemetryError(f"--otel-traces-file: cannot open {path}: {exc}") from exc

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s), default=str) + "\n" for s in spans)
        with self._lock:
            if self._out.closed:
                return SpanExportResult.FAILURE
            self._out.write(lines)
            self._out.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._out.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

"""OpenTelemetry set-up: one TracerProvider and one MeterProvider per process.

Exporters: ``none`` (providers exist, nothing is exported), ``console`` (stdout) and
``otlp`` (needs ``pip install opentelemetry-exporter-otlp``; configured by the standard
``OTEL_EXPORTER_OTLP_*`` environment variables).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

EXPORTERS = ("none", "console", "otlp")
_OTLP_PACKAGE = "opentelemetry.exporter.otlp.proto.grpc"


class TelemetryError(RuntimeError):
    """An exporter that cannot be set up (unknown name, missing package)."""


@dataclass(frozen=True, slots=True)
class Telemetry:
    service_name: str
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def shutdown(self) -> None:
        """Flush pending spans and metrics, then stop the exporters."""
        self.tracer_provider.force_flush()
        self.meter_provider.force_flush()
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def configure_telemetry(
    service_name: str,
    traces_exporter: str = "none",
    metrics_exporter: str = "none",
    *,
    install_global: bool = True,
) -> Telemetry:
    """Create the providers and (by default) install them as the global ones.

    Raises :class:`TelemetryError` for an unknown exporter or a missing OTLP package.
    """
    for kind, name in (("traces", traces_exporter), ("metrics", metrics_exporter)):
        if name not in EXPORTERS:
            raise TelemetryError(f"{kind} exporter must be one of {', '.join(EXPORTERS)}: {name!r}")
    span_exporter = _span_exporter(traces_exporter)
    readers = _readers(metrics_exporter)
    resource = Resource.create({SERVICE_NAME: service_name})
    # With no exporter, spans would be built and dropped on every call: sample none, so
    # they are non-recording and nearly free (the hot paths make one per RPC).
    sampler = ALWAYS_OFF if span_exporter is None else ParentBased(ALWAYS_ON)
    tracer_provider = TracerProvider(resource=resource, sampler=sampler)
    if span_exporter is not None:
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    if install_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    return Telemetry(service_name, tracer_provider, meter_provider)


def _span_exporter(name: str) -> SpanExporter | None:
    if name == "console":
        return ConsoleSpanExporter(out=sys.stdout)  # the stdout of now, not of import time
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


def _otlp_class(module: str, name: str) -> Any:
    try:
        loaded = importlib.import_module(f"{_OTLP_PACKAGE}.{module}")
    except ImportError as exc:
        raise TelemetryError(
            f"the otlp exporter needs the {_OTLP_PACKAGE} package "
            f"({exc}); install it with: pip install opentelemetry-exporter-otlp"
        ) from exc
    return getattr(loaded, name)

"""Telemetry providers and exporters (not installed globally here: that is once per process)."""

from __future__ import annotations

import pytest

from tide.server import TelemetryError, _telemetry, configure_telemetry


def test_console_exporter_prints_spans_on_shutdown(capsys: pytest.CaptureFixture[str]) -> None:
    telemetry = configure_telemetry("tide-test", "console", "none", install_global=False)
    tracer = telemetry.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("flush-segment"):
        pass
    telemetry.shutdown()
    out = capsys.readouterr().out
    assert '"name": "flush-segment"' in out
    assert '"service.name": "tide-test"' in out


def test_none_exporter_exports_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    telemetry = configure_telemetry("tide-test", install_global=False)
    with telemetry.tracer_provider.get_tracer("test").start_as_current_span("quiet"):
        pass
    telemetry.meter_provider.get_meter("test").create_counter("appends").add(1)
    telemetry.shutdown()
    assert "quiet" not in capsys.readouterr().out


def test_unknown_exporter_is_rejected() -> None:
    with pytest.raises(
        TelemetryError, match="traces exporter must be one of none, console, file, otlp"
    ):
        configure_telemetry("tide-test", "jaeger", "none", install_global=False)


@pytest.mark.parametrize(("traces", "metrics"), [("otlp", "none"), ("none", "otlp")])
def test_missing_otlp_package_says_what_to_install(
    traces: str, metrics: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The package is a dependency; pretend it is not installed.
    monkeypatch.setattr(_telemetry, "_OTLP_PACKAGE", "opentelemetry.exporter.not_installed")
    with pytest.raises(TelemetryError, match="pip install opentelemetry-exporter-otlp"):
        configure_telemetry("tide-test", traces, metrics, install_global=False)


def test_otlp_exporter_is_built_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    telemetry = configure_telemetry("tide-test", "auto", "none", install_global=False)
    try:
        processors = telemetry.tracer_provider._active_span_processor._span_processors
        exporters = [type(p.span_exporter).__name__ for p in processors]  # type: ignore[attr-defined]
        assert exporters == ["OTLPSpanExporter"], exporters
    finally:
        telemetry.shutdown()  # no span was made: nothing is sent


@pytest.mark.parametrize(
    ("traces", "env", "expected"),
    [
        ("none", None, "AlwaysOffExemplarFilter"),  # no span is sampled: no exemplar either
        ("console", None, "TraceBasedExemplarFilter"),
        ("none", "always_on", "AlwaysOnExemplarFilter"),  # the operator's choice stands
    ],
)
def test_exemplars_only_when_traces_are_exported(
    traces: str, env: str | None, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is None:
        monkeypatch.delenv("OTEL_METRICS_EXEMPLAR_FILTER", raising=False)
    else:
        monkeypatch.setenv("OTEL_METRICS_EXEMPLAR_FILTER", env)
    telemetry = configure_telemetry("tide-test", traces, "none", install_global=False)
    try:
        exemplar_filter = telemetry.meter_provider._sdk_config.exemplar_filter
        assert type(exemplar_filter).__name__ == expected
    finally:
        telemetry.shutdown()

"""Telemetry providers and exporters (not installed globally here: that is once per process)."""

from __future__ import annotations

import importlib.util

import pytest

from tide.server import TelemetryError, configure_telemetry


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


@pytest.mark.skipif(
    importlib.util.find_spec("opentelemetry.exporter.otlp") is not None,
    reason="an OpenTelemetry exporter package is installed",
)
@pytest.mark.parametrize(("traces", "metrics"), [("otlp", "none"), ("none", "otlp")])
def test_missing_otlp_package_says_what_to_install(traces: str, metrics: str) -> None:
    with pytest.raises(TelemetryError, match="pip install opentelemetry-exporter-otlp"):
        configure_telemetry("tide-test", traces, metrics, install_global=False)

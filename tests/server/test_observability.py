"""Prometheus endpoint, span file exporter, sampling, trace context in gRPC metadata, trace
ids in log lines, sampled gauges (in-process; nothing installed globally)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.metrics import CallbackOptions
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from tide.server import TelemetryError, configure_telemetry, traced_channel
from tide.server._logging import JsonFormatter, TextFormatter
from tide.server._metrics import SampledGauges, short_service_name
from tide.server._telemetry import OTLP_ENDPOINT_ENV, TRACING, _resolve_auto
from tide.server._tracing import extract_context, trace_metadata


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text: str = reply.read().decode()
        return text


def test_metrics_listen_serves_prometheus_on_the_bound_port() -> None:
    telemetry = configure_telemetry("tide-test", metrics_listen="127.0.0.1:0", install_global=False)
    try:
        assert telemetry.metrics_endpoint is not None
        host, _, port = telemetry.metrics_endpoint.rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        meter = telemetry.meter_provider.get_meter("tide.test")
        meter.create_counter("tide_test_appended_bytes_total", unit="By").add(42)
        text = scrape(telemetry.metrics_endpoint)
        assert "tide_test_appended_bytes_total" in text
        assert 'service_name="tide-test"' in text  # target_info
    finally:
        telemetry.shutdown()
    with pytest.raises(OSError):
        scrape(telemetry.metrics_endpoint)


def test_two_processes_worth_of_endpoints_do_not_share_a_registry() -> None:
    first = configure_telemetry("tide-a", metrics_listen="127.0.0.1:0", install_global=False)
    second = configure_telemetry("tide-b", metrics_listen="127.0.0.1:0", install_global=False)
    try:
        first.meter_provider.get_meter("a").create_counter("tide_a_total").add(1)
        assert first.metrics_endpoint and second.metrics_endpoint
        assert "tide_a_total" in scrape(first.metrics_endpoint)
        assert "tide_a_total" not in scrape(second.metrics_endpoint)
    finally:
        first.shutdown()
        second.shutdown()


@pytest.mark.parametrize("listen", ["nonsense", "127.0.0.1:99999", ":80"])
def test_malformed_metrics_listen_is_rejected(listen: str) -> None:
    with pytest.raises(TelemetryError, match="--metrics-listen"):
        configure_telemetry("tide-test", metrics_listen=listen, install_global=False)


def test_file_exporter_writes_one_json_line_per_span(tmp_path: Path) -> None:
    pattern = str(tmp_path / "{service}-{pid}.jsonl")
    telemetry = configure_telemetry("tide-test", "file", traces_file=pattern, install_global=False)
    tracer = telemetry.tracer_provider.get_tracer("test")
    attributes = {"messaging.destination.name": "T"}
    with (
        tracer.start_as_current_span("outer") as outer,
        tracer.start_as_current_span("inner", attributes=attributes),
    ):
        pass
    telemetry.shutdown()
    path = tmp_path / f"tide-test-{os.getpid()}.jsonl"
    spans = {s["name"]: s for s in map(json.loads, path.read_text().splitlines())}
    assert set(spans) == {"outer", "inner"}
    assert spans["inner"]["trace_id"] == spans["outer"]["trace_id"]
    assert spans["inner"]["parent_span_id"] == spans["outer"]["span_id"]
    assert spans["outer"]["parent_span_id"] is None
    assert spans["outer"]["trace_id"] == f"{outer.get_span_context().trace_id:032x}"
    assert spans["inner"]["attributes"] == {"messaging.destination.name": "T"}
    assert spans["inner"]["service"] == "tide-test"


def test_file_exporter_needs_a_path() -> None:
    with pytest.raises(TelemetryError, match="--otel-traces-file"):
        configure_telemetry("tide-test", "file", install_global=False)


def test_sampler_ratio_zero_records_no_new_trace(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    telemetry = configure_telemetry(
        "tide-test", "file", traces_file=str(path), sampler_ratio=0.0, install_global=False
    )
    with telemetry.tracer_provider.get_tracer("test").start_as_current_span("dropped") as span:
        assert not span.is_recording()
    telemetry.shutdown()
    assert path.read_text() == ""


def test_sampler_ratio_outside_0_1_is_rejected() -> None:
    with pytest.raises(TelemetryError, match="sampler ratio"):
        configure_telemetry("tide-test", "console", sampler_ratio=1.5, install_global=False)


def test_auto_exporter_is_none_without_an_otlp_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OTLP_ENDPOINT_ENV, raising=False)
    assert _resolve_auto("auto") == "none"
    assert _resolve_auto("console") == "console"


def test_auto_exporter_is_otlp_with_an_endpoint_when_installed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(OTLP_ENDPOINT_ENV, "http://127.0.0.1:4317")
    assert _resolve_auto("auto") == "otlp"  # the exporter is a dependency
    assert "not installed" not in caplog.text


def test_trace_context_round_trips_through_metadata() -> None:
    tracer = TracerProvider().get_tracer("test")
    assert trace_metadata() == []  # no current span: nothing to send
    with tracer.start_as_current_span("caller") as span:
        metadata = trace_metadata()
    assert [key for key, _ in metadata] == ["traceparent"]
    parent = extract_context([("user-agent", "x"), *metadata])
    assert parent is not None
    child = tracer.start_span("callee", context=parent)
    assert child.get_span_context().trace_id == span.get_span_context().trace_id
    parent_ctx = getattr(child, "parent", None)
    assert parent_ctx is not None and parent_ctx.span_id == span.get_span_context().span_id
    assert extract_context([("user-agent", "x")]) is None


async def _call_through_traced_channel(traced: bool) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    async def echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        seen.extend(context.invocation_metadata() or ())
        return request

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    tracer = TracerProvider().get_tracer("test")
    TRACING.enabled = traced
    try:
        channel = traced_channel(f"127.0.0.1:{port}")
        with tracer.start_as_current_span("caller") as span:
            reply = await channel.unary_unary("/test.Echo/Echo", None, None)(b"hi", timeout=10)
            trace_id = span.get_span_context().trace_id
        assert reply == b"hi"
        await channel.close(None)
    finally:
        TRACING.enabled = False
        await server.stop(None)
    return [(k, v) for k, v in seen if k != "traceparent" or f"{trace_id:032x}" in v]


def test_traced_channel_sends_the_callers_traceparent() -> None:
    seen = asyncio.run(_call_through_traced_channel(True))
    assert "traceparent" in dict(seen)


def test_channels_carry_nothing_while_tracing_is_off() -> None:
    seen = asyncio.run(_call_through_traced_channel(False))
    assert "traceparent" not in dict(seen)


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("tide.test", logging.INFO, __file__, 1, message, None, None)


def test_log_lines_carry_the_current_trace_ids() -> None:
    tracer = TracerProvider().get_tracer("test")
    json_fmt, text_fmt = JsonFormatter("storage"), TextFormatter("storage")
    assert "trace_id" not in json.loads(json_fmt.format(_record("outside")))
    with tracer.start_as_current_span("call") as span:
        entry = json.loads(json_fmt.format(_record("inside")))
        text = text_fmt.format(_record("inside"))
    ctx = span.get_span_context()
    assert entry["trace_id"] == f"{ctx.trace_id:032x}"
    assert entry["span_id"] == f"{ctx.span_id:016x}"
    assert f"trace_id={ctx.trace_id:032x}" in text


def test_sampled_gauges_report_the_last_sample() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("tide.test")
    state = {"n": 1, "fail": False}

    def sample() -> dict[str, Any]:
        if state["fail"]:
            raise RuntimeError("boom")
        return {"tide_test_things": state["n"], "tide_test_lag": [(5, {"queue": 1})]}

    gauges = SampledGauges(meter, sample)
    gauges.gauge("tide_test_things", "things")
    gauges.gauge("tide_test_lag", "lag")
    gauges.gauge("tide_test_absent", "never sampled")

    def values() -> dict[str, list[tuple[float, dict[str, Any]]]]:
        data = reader.get_metrics_data()
        assert data is not None
        return {
            m.name: [(p.value, dict(p.attributes or {})) for p in m.data.data_points]  # type: ignore[union-attr]
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        }

    asyncio.run(gauges.sample_now())
    first = values()
    assert first["tide_test_things"] == [(1, {})]
    assert first["tide_test_lag"] == [(5, {"queue": 1})]
    assert "tide_test_absent" not in first or first["tide_test_absent"] == []
    state.update(n=7, fail=False)
    asyncio.run(gauges.sample_now())
    assert values()["tide_test_things"] == [(7, {})]
    state["fail"] = True
    asyncio.run(gauges.sample_now())  # logged, never raised; the last sample stays
    assert values()["tide_test_things"] == [(7, {})]
    assert gauges._observe("tide_test_things", CallbackOptions())


def test_short_service_names() -> None:
    assert short_service_name("tide.v1.NameServer") == "nameserver"
    assert short_service_name("tide.v1.Storage") == "storage"

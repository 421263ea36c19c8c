"""Histograms and percentiles, the request template and its time stamp, the text report,
the baseline ratio and the PNG plot (on a made-up report: no cluster)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tide.bench import format_baseline, format_run, with_baseline, write_plot
from tide.bench._load import (
    PLACEHOLDER,
    LoadState,
    Pacer,
    Sample,
    _count_results,
    request_template,
    sent_ns,
    stamp,
)
from tide.bench._stats import HIGHEST_US, SUMMARY_KEYS, Latency, percentile_curve, summarize
from tide.bench._workload import STAMP_BYTES, Workload
from tide.v1 import gateway_pb2 as pb

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_latency_percentiles_in_ms() -> None:
    latency = Latency()
    for micros in range(1, 10_001):  # 1 us .. 10 ms, uniform
        latency.record(micros)
    summary = latency.summary()
    assert summary["count"] == 10_000
    assert abs(summary["p50"] - 5.0) < 0.01
    assert abs(summary["p95"] - 9.5) < 0.01
    assert abs(summary["p99"] - 9.9) < 0.01
    assert abs(summary["p999"] - 9.99) < 0.01
    assert abs(summary["max"] - 10.0) < 0.01
    assert abs(summary["mean"] - 5.0) < 0.01
    assert list(summary) == list(SUMMARY_KEYS)


def test_tick_folds_the_interval_into_the_total() -> None:
    latency = Latency()
    latency.record(1_000, count=3)
    first = latency.tick()
    assert first["count"] == 3
    assert abs(first["p50"] - 1.0) < 0.01
    latency.record(5_000)
    second = latency.tick()
    assert second["count"] == 1
    assert abs(second["max"] - 5.0) < 0.01
    assert latency.tick()["count"] == 0  # nothing since
    total = latency.summary()
    assert total["count"] == 4
    latency.reset()
    assert latency.summary()["count"] == 0


def test_values_out_of_range_are_clamped() -> None:
    latency = Latency()
    latency.record(-5)  # clocks: a consumer's now before the producer's stamp
    latency.record(HIGHEST_US * 10)
    summary = latency.summary()
    assert summary["count"] == 2
    assert summary["p50"] <= 0.002
    assert summary["max"] >= HIGHEST_US / 1000 * 0.99


def test_empty_summary_is_zeros() -> None:
    summary = Latency().summary()
    assert summary == dict.fromkeys(SUMMARY_KEYS, 0)
    assert percentile_curve(Latency().total) == []


def test_percentile_curve_ends_at_the_max() -> None:
    latency = Latency()
    for micros in (100, 200, 300, 40_000):
        latency.record(micros)
    latency.tick()
    curve = percentile_curve(latency.total)
    assert curve[-1][0] == 100.0
    assert abs(curve[-1][1] - 40.0) < 0.1
    assert [p for p, _ in curve] == sorted(p for p, _ in curve)
    assert summarize(latency.total)["count"] == 4


def test_request_template_is_stamped_per_call() -> None:
    template = request_template("T_bench", message_size=64, batch_size=5)
    now = time.time_ns()
    request = pb.ProduceRequest.FromString(template.replace(PLACEHOLDER, stamp(now)))
    assert len(request.messages) == 5
    for message in request.messages:
        assert message.topic == "T_bench"
        assert len(message.body) == 64
        assert sent_ns(message.body) == now
    assert len(stamp(now)) == STAMP_BYTES


def test_request_template_asks_for_compact_results() -> None:
    request = pb.ProduceRequest.FromString(request_template("T", 64, 3))
    assert request.compact_results and len(request.messages) == 3


def test_answers_are_counted_from_runs_or_from_a_result_per_message() -> None:
    """A run per queue (compact results) or, from a gateway that predates them, a
    result per message: the same counts."""
    failed = pb.ProduceResult.SEND_FAILED
    compact = pb.ProduceResponse(
        runs=[
            pb.ProduceRun(count=3),
            pb.ProduceRun(first_index=3, count=2, status=failed, error="UNAVAILABLE: x"),
        ]
    )
    per_message = pb.ProduceResponse(
        results=[pb.ProduceResult()] * 3
        + [pb.ProduceResult(status=failed, error="UNAVAILABLE: x")] * 2
    )
    for reply in (compact, per_message):
        state = LoadState()
        _count_results(state, reply)
        counters = state.counters
        assert (counters.publish_calls, counters.published, counters.send_failed) == (1, 3, 2)
        assert counters.last_error == "UNAVAILABLE: x"


def test_pacer_spaces_the_calls() -> None:
    async def slots() -> float:
        pacer = Pacer(rate=1000.0, batch=10)  # a call every 10 ms
        begin = time.monotonic()
        for _ in range(6):
            await pacer.wait()
        return time.monotonic() - begin

    assert asyncio.run(slots()) >= 0.05  # slots 0..5: the last is due 50 ms after start

    async def unlimited() -> None:
        pacer = Pacer(rate=0.0, batch=10)
        for _ in range(1000):
            await pacer.wait()

    asyncio.run(unlimited())


def _summary(base_ms: float, count: int) -> dict[str, float]:
    return {
        "count": count,
        "mean": base_ms,
        "p50": base_ms,
        "p95": base_ms * 2,
        "p99": base_ms * 3,
        "p999": base_ms * 4,
        "max": base_ms * 5,
    }


def make_report(ok: bool = True) -> dict[str, Any]:
    workload = Workload(name="unit", rate=1000.0, warmup_s=1.0, duration_s=2.0, batch_size=10)
    timeline = [
        Sample(t_s, t_s > 1.0, 1000, 990, 1.0, 10, 1.0, 3.0, 2.0, 6.0).to_dict()
        for t_s in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
    ]
    return {
        "kind": "run",
        "workload": workload.to_dict(),
        "gateway": "127.0.0.1:1",
        "started_at": "2026-11-22T00:00:00+00:00",
        "topics": ["bench-unit-abc-0"],
        "queues": 4,
        "measured_s": 2.0,
        "publish": {"messages": 2000, "msgs_per_s": 1000.0, "mb_per_s": 0.128},
        "consume": {"messages": 1990, "msgs_per_s": 995.0, "mb_per_s": 0.127},
        "backlog": {"end": 10, "max": 20},
        "publish_latency_ms": _summary(1.5, 200),
        "e2e_latency_ms": _summary(2.5, 2000),
        "totals": {
            "published": 3000,
            "consumed": 3000 if ok else 2990,
            "publish_calls": 300,
            "publish_errors": 0,
            "send_failed": 0,
            "consume_errors": 0,
            "offset_resets": 0,
            "drain_s": 0.05,
        },
        "errors": 0,
        "last_error": "",
        "ok": ok,
        "client_cpu": {"cpu_s": 0.4, "core_share": 0.2, "us_per_msg": 200.0},
        "machine": {"cpus": 2, "python": "3.11", "loadavg": [1.0, 2.0, 3.0]},
        "timeline": timeline,
        "publish_percentiles": [[0.0, 1.0], [50.0, 1.5], [99.0, 4.5], [100.0, 7.5]],
        "e2e_percentiles": [[0.0, 2.0], [50.0, 2.5], [99.9, 10.0], [100.0, 12.5]],
        "baseline": None,
        "ratio_to_baseline": None,
    }


def make_baseline() -> dict[str, Any]:
    return {
        "kind": "baseline",
        "workload": Workload(name="unit").to_dict(),
        "server": "bare gRPC echo",
        "measured_s": 1.0,
        "publish": {"messages": 4000, "msgs_per_s": 4000.0, "mb_per_s": 0.512},
        "publish_latency_ms": _summary(0.5, 400),
        "errors": 0,
        "last_error": "",
        "client_cpu": {"cpu_s": 0.5, "core_share": 0.5},
        "server_cpu": {"cpu_s": 0.6, "core_share": 0.6},
        "machine": {"cpus": 2, "python": "3.11", "loadavg": None},
    }


def test_format_run_shows_rates_latencies_and_totals() -> None:
    text = format_run(make_report())
    lines = text.splitlines()
    assert lines[0].startswith("workload unit: 1 topic(s) x 4 queues per broker")
    assert "target 1,000 msgs/s" in lines[0]
    publish = next(line for line in lines if line.startswith("publish "))
    assert publish.split() == ["publish", "1000.0", "0.128", "2000"]
    header = next(line for line in lines if line.startswith("LATENCY MS"))
    assert header.split() == ["LATENCY", "MS", "COUNT", "MEAN", "P50", "P95", "P99", "P99.9", "MAX"]
    e2e = next(line for line in lines if line.startswith("end-to-end"))
    assert e2e.split() == ["end-to-end", "2000", "2.5", "2.5", "5.0", "7.5", "10.0", "12.5"]
    assert "backlog: 10 at the end, at most 20" in text
    assert "target rate 1,000 msgs/s: published at 100% of it" in text
    assert "published 3,000, consumed 3,000" in text
    assert "load average at the end: 1.00 2.00 3.00" in text
    assert "NOT OK" not in text
    assert "baseline" not in text
    assert "NOT OK" in format_run(make_report(ok=False))
    unlimited = make_report()
    unlimited["workload"]["rate"] = 0.0
    assert "target rate" not in format_run(unlimited)


def producer_only_report() -> dict[str, Any]:
    report = make_report()
    report["workload"]["consumers_per_topic"] = 0
    report["consume"] = {"messages": 0, "msgs_per_s": 0.0, "mb_per_s": 0.0}
    report["e2e_latency_ms"] = _summary(0.0, 0)
    report["e2e_percentiles"] = []
    report["totals"]["consumed"] = 0
    return report


def test_format_run_without_consumers_shows_no_consume_side() -> None:
    text = format_run(producer_only_report())
    lines = text.splitlines()
    assert "and 0 consumer(s) per topic" in lines[0]
    assert any(line.startswith("publish ") for line in lines)
    assert not any(line.startswith(("consume ", "end-to-end", "backlog")) for line in lines)
    assert "no consumers: a producer-only run" in text
    assert "publish (call)" in text
    assert "NOT OK" not in text
    failed = producer_only_report()
    failed["ok"] = False
    assert "NOT OK: errors\n" in format_run(failed) + "\n"


def test_baseline_ratio() -> None:
    report = with_baseline(make_report(), make_baseline())
    assert report["ratio_to_baseline"] == 0.25
    assert report["baseline"]["publish"]["msgs_per_s"] == 4000.0
    assert "Tide publishes at 0.25x of it" in format_run(report)
    empty = make_baseline()
    empty["publish"]["msgs_per_s"] = 0.0
    assert with_baseline(make_report(), empty)["ratio_to_baseline"] is None


def test_format_baseline() -> None:
    text = format_baseline(make_baseline())
    assert text.startswith("baseline for unit:")
    echo = next(line for line in text.splitlines() if line.startswith("echo "))
    assert echo.split() == ["echo", "4000.0", "0.512", "4000"]
    assert "echo server 0.60" in text


def test_write_plot(tmp_path: Path) -> None:
    path = tmp_path / "run.png"
    write_plot(with_baseline(make_report(), make_baseline()), path)
    assert path.read_bytes().startswith(PNG_MAGIC)
    empty = make_report()
    empty["timeline"] = []
    empty["publish_percentiles"] = []
    empty["e2e_percentiles"] = []
    write_plot(empty, tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes().startswith(PNG_MAGIC)
    write_plot(producer_only_report(), tmp_path / "producers.png")
    assert (tmp_path / "producers.png").read_bytes().startswith(PNG_MAGIC)

"""A ``tide bench`` report as a table (text), and as a PNG plot (matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tide.bench._stats import PERCENTILES
from tide.cli._output import Cell, table

LATENCY_HEADERS = [
    "LATENCY MS",
    "COUNT",
    "MEAN",
    *(label.upper() for _, label, _ in PERCENTILES),
    "MAX",
]
PLOT_DPI = 100


def latency_row(label: str, summary: dict[str, float]) -> list[Cell]:
    return [
        label,
        int(summary["count"]),
        summary["mean"],
        *(summary[key] for key, _, _ in PERCENTILES),
        summary["max"],
    ]


def _workload_line(workload: dict[str, Any]) -> str:
    rate = workload["rate"]
    shown_rate = "as fast as possible" if not rate else f"target {rate:,.0f} msgs/s"
    return (
        f"workload {workload['name']}: {workload['topics']} topic(s) x "
        f"{workload['queues_per_topic']} queues per broker, {workload['message_size']} B, "
        f"batches of {workload['batch_size']}, {workload['producers_per_topic']} producer(s) x "
        f"{workload['inflight']} in flight"
        f"{' on a ProduceStream' if workload.get('produce_api') == 'stream' else ''} and "
        f"{workload['consumers_per_topic']} consumer(s) "
        f"per topic, {shown_rate}"
    )


def format_run(report: dict[str, Any]) -> str:
    """The report of ``tide bench run`` as text: rates, backlog, latency percentiles,
    totals, client CPU and (when measured) the baseline ratio."""
    totals = report["totals"]
    producer_only = report["workload"]["consumers_per_topic"] == 0
    lines = [
        _workload_line(report["workload"]),
        f"gateway {report['gateway']}, {report['queues']} queues, warm-up "
        f"{report['workload']['warmup_s']:g} s, measured {report['measured_s']:.1f} s",
        "",
        table(
            ["", "MSGS/S", "MB/S", "MESSAGES"],
            [
                [
                    name,
                    report[name]["msgs_per_s"],
                    report[name]["mb_per_s"],
                    report[name]["messages"],
                ]
                for name in ("publish", "consume")[: 1 if producer_only else 2]
            ],
        ),
        *_target_line(report),
        "no consumers: a producer-only run (the messages stay until the topics are deleted)"
        if producer_only
        else f"backlog: {report['backlog']['end']:,} at the end, at most "
        f"{report['backlog']['max']:,} while measuring",
        "",
        table(
            LATENCY_HEADERS,
            [
                latency_row("publish (call)", report["publish_latency_ms"]),
                *([] if producer_only else [latency_row("end-to-end", report["e2e_latency_ms"])]),
            ],
        ),
        "",
        f"totals (warm-up and drain included): published {totals['published']:,}, "
        f"consumed {totals['consumed']:,} (drained in {totals['drain_s']:.2f} s); "
        f"errors {report['errors']} (publish calls failed {totals['publish_errors']}, "
        f"send failed {totals['send_failed']}, pulls failed {totals['consume_errors']}, "
        f"offset resets {totals['offset_resets']})",
        f"client CPU{_processes(report)}: {report['client_cpu']['core_share']:.2f} of a core, "
        f"{report['client_cpu']['us_per_msg']:.1f} us per published message",
    ]
    if report["last_error"]:
        lines.append(f"last error: {report['last_error']}")
    if report.get("baseline"):
        baseline = report["baseline"]
        lines.append(
            f"baseline (bare gRPC echo, same shape, {baseline['measured_s']:.1f} s): "
            f"{baseline['publish']['msgs_per_s']:,.0f} msgs/s; Tide publishes at "
            f"{report['ratio_to_baseline']:.2f}x of it"
        )
    load = report["machine"].get("loadavg")
    if load:
        lines.append(f"load average at the end: {' '.join(f'{v:.2f}' for v in load)}")
    if not report["ok"]:
        lines.append(
            "NOT OK: errors" if producer_only else "NOT OK: errors, or published != consumed"
        )
    return "\n".join(lines)


def _target_line(report: dict[str, Any]) -> list[str]:
    """How close the publish rate came to a target rate (none without a target)."""
    target = report["workload"]["rate"]
    if not target:
        return []
    share = report["publish"]["msgs_per_s"] / target
    return [f"target rate {target:,.0f} msgs/s: published at {share:.0%} of it"]


def _processes(report: dict[str, Any]) -> str:
    """The client CPU label's suffix when producers or consumers ran in processes of
    their own."""
    workload = report["workload"]
    parts = []
    if (producers := int(workload.get("producer_processes", 1))) > 1:
        parts.append(f"{producers} producer processes")
    consumers = int(workload.get("consumer_processes", 1))
    if consumers > 1 and report.get("kind") == "run":
        parts.append(f"{consumers} consumer processes")
    return f" (main + {' + '.join(parts)})" if parts else ""


def format_baseline(baseline: dict[str, Any]) -> str:
    """The report of ``tide bench baseline`` as text."""
    publish = baseline["publish"]
    lines = [
        _workload_line(baseline["workload"]).replace("workload", "baseline for", 1),
        f"server: {baseline['server']}, measured {baseline['measured_s']:.1f} s",
        "",
        table(
            ["", "MSGS/S", "MB/S", "MESSAGES"],
            [["echo", publish["msgs_per_s"], publish["mb_per_s"], publish["messages"]]],
        ),
        "",
        table(LATENCY_HEADERS, [latency_row("echo (call)", baseline["publish_latency_ms"])]),
        "",
        f"CPU: client{_processes(baseline)} {baseline['client_cpu']['core_share']:.2f} of a core, "
        "echo server "
        f"{baseline['server_cpu']['core_share']:.2f}; errors {baseline['errors']}",
    ]
    if baseline["last_error"]:
        lines.append(f"last error: {baseline['last_error']}")
    return "\n".join(lines)


def _nines(percentile: float) -> float:
    """x position of a percentile on a "number of nines" axis (90 -> 10, 99 -> 100)."""
    return 1 / max(1 - percentile / 100, 1e-6)


def _leading(value: float) -> int:
    """The leading digit of a positive number (0 for others)."""
    if value <= 0:
        return 0
    return int(f"{value:e}"[0])


def write_plot(report: dict[str, Any], path: Path) -> None:
    """A PNG of the run: throughput and backlog over time, interval p50/p99 latencies over
    time, and the whole latency distributions (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    figure, (rates, latency, curves) = plt.subplots(3, 1, figsize=(10, 11))
    name, _, shape = _workload_line(report["workload"]).partition(": ")
    title = f"{name}\n{shape}"
    if report.get("ratio_to_baseline") is not None:
        title += f"\nTide / bare gRPC echo: {report['ratio_to_baseline']:.2f}x"
    figure.suptitle(title, fontsize=9, wrap=True)
    _plot_timeline(report, rates, latency)
    _plot_curves(report, curves)
    plain = FuncFormatter(lambda value, _position: f"{value:g}")
    # minor ticks: label 2x and 5x only (1x are the major ones)
    sparse = FuncFormatter(
        lambda value, _position: f"{value:g}" if _leading(value) in (2, 5) else ""
    )
    for axes in (latency, curves):
        axes.yaxis.set_major_formatter(plain)
        axes.yaxis.set_minor_formatter(sparse)
    figure.tight_layout()
    figure.savefig(path, dpi=PLOT_DPI)
    plt.close(figure)


def _plot_timeline(report: dict[str, Any], rates: Any, latency: Any) -> None:
    timeline = report["timeline"]
    times = [point["t_s"] for point in timeline]
    consumed = report["workload"]["consumers_per_topic"] > 0
    rates.plot(times, [p["publish_rate"] for p in timeline], label="publish msgs/s")
    if consumed:
        rates.plot(times, [p["consume_rate"] for p in timeline], label="consume msgs/s")
    rates.set_ylabel("msgs/s")
    backlog = rates.twinx()
    backlog.plot(times, [p["backlog"] for p in timeline], "k:", label="backlog")
    backlog.set_ylabel("backlog (messages)")
    rates.legend(loc="upper left", fontsize=8)
    backlog.legend(loc="upper right", fontsize=8)

    for key, label in (
        ("publish_p50_ms", "publish p50"),
        ("publish_p99_ms", "publish p99"),
        *((("e2e_p50_ms", "end-to-end p50"), ("e2e_p99_ms", "end-to-end p99")) if consumed else ()),
    ):
        latency.plot(times, [max(p[key], 1e-3) for p in timeline], label=label)
    latency.set_yscale("log")
    latency.set_ylabel("ms (per interval)")
    latency.set_xlabel("seconds since start (warm-up shaded)")
    latency.legend(fontsize=8)
    warmup_s = report["workload"]["warmup_s"]
    for axes in (rates, latency):
        if warmup_s:
            axes.axvspan(0, warmup_s, color="0.9", label="_warm-up")
        axes.set_xlim(left=0)
        axes.grid(alpha=0.3)


def _plot_curves(report: dict[str, Any], curves: Any) -> None:
    plotted = False
    for key, label in (("publish_percentiles", "publish"), ("e2e_percentiles", "end-to-end")):
        # The last point is 100 % (the max), which has no place on a nines axis.
        points = [(p, ms) for p, ms in report[key] if p < 100]
        if points:
            plotted = True
            curves.plot(
                [_nines(p) for p, _ in points], [max(ms, 1e-3) for _, ms in points], label=label
            )
    ticks = [0.0, 90.0, 99.0, 99.9, 99.99, 99.999]
    curves.set_xscale("log")
    curves.set_yscale("log")
    curves.set_xticks([_nines(p) for p in ticks], [f"{p:g}%" for p in ticks])
    curves.set_xlabel("percentile (measured window)")
    curves.set_ylabel("latency ms")
    curves.grid(alpha=0.3, which="both")
    if plotted:
        curves.legend(fontsize=8)

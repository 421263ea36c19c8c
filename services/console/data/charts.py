"""The live charts' data: one snapshot of the services' Prometheus endpoints (the text
exposition, parsed with prometheus_client's parser). Counters and latency histograms'
sum and count are returned as totals: the browser keeps a bounded ring of snapshots and
draws rates and mean latencies from consecutive ones (the console keeps nothing).
Metric names: docs/operations.md, "Metrics"."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from services.console.data.limits import (
    METRICS_MAX_BYTES,
    METRICS_SCRAPE_THREADS,
    METRICS_TIMEOUT_S,
)

# Throughput series: key -> (label, the counter's sample name), summed over labels.
COUNTERS: dict[str, tuple[str, str]] = {
    "produced": ("produced messages/s (gateway)", "tide_gateway_produced_messages_total"),
    "pulled": ("pulled messages/s (gateway)", "tide_gateway_pulled_messages_total"),
    "pop_received": ("POP received messages/s (dispatch)", "tide_dispatch_pop_received_total"),
    "appended": ("appended messages/s (storage)", "tide_storage_appended_messages_total"),
}
# Latency series: key -> (label, the histogram's name): mean = d(sum) / d(count).
LATENCIES: dict[str, tuple[str, str]] = {
    "produce_latency": ("produce latency, mean (gateway)", "tide_gateway_produce_latency_seconds"),
    "append_latency": ("append latency, mean (storage)", "tide_storage_append_latency_seconds"),
}


@dataclass(frozen=True)
class EndpointSnapshot:
    name: str
    endpoint: str
    # "" when scraped; else why not (the page shows it).
    error: str = ""
    counters: dict[str, float] = field(default_factory=dict)
    # key -> [sum in seconds, count]
    latencies: dict[str, list[float]] = field(default_factory=dict)


def snapshot(endpoints: Sequence[tuple[str, str]]) -> dict[str, object]:
    """A JSON-ready snapshot of every endpoint (scraped in parallel, each bounded)."""
    with ThreadPoolExecutor(max(1, min(METRICS_SCRAPE_THREADS, len(endpoints)))) as pool:
        snapshots = list(pool.map(lambda pair: scrape(*pair), endpoints))
    return {
        "time_ms": int(time.time() * 1000),
        "series": {key: label for key, (label, _) in (COUNTERS | LATENCIES).items()},
        "endpoints": [vars(s) for s in snapshots],
    }


def scrape(name: str, endpoint: str) -> EndpointSnapshot:
    try:
        with urllib.request.urlopen(
            f"http://{endpoint}/metrics", timeout=METRICS_TIMEOUT_S
        ) as reply:
            data = reply.read(METRICS_MAX_BYTES + 1)
    except (OSError, urllib.error.URLError) as exc:
        return EndpointSnapshot(name, endpoint, f"cannot scrape http://{endpoint}/metrics: {exc}")
    if len(data) > METRICS_MAX_BYTES:
        return EndpointSnapshot(
            name, endpoint, f"its exposition is over {METRICS_MAX_BYTES} bytes; not read"
        )
    try:
        counters, latencies = parse(data.decode("utf-8", errors="replace"))
    except ValueError as exc:
        return EndpointSnapshot(name, endpoint, f"not a Prometheus text exposition: {exc}")
    return EndpointSnapshot(name, endpoint, "", counters, latencies)


def parse(text: str) -> tuple[dict[str, float], dict[str, list[float]]]:
    """The COUNTERS and LATENCIES found in ``text`` (summed over their labels)."""
    wanted = {sample: key for key, (_, sample) in COUNTERS.items()}
    histograms = {name: key for key, (_, name) in LATENCIES.items()}
    counters: dict[str, float] = {}
    latencies: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                key = wanted[sample.name]
                counters[key] = counters.get(key, 0.0) + sample.value
            elif family.name in histograms and sample.name.endswith(("_sum", "_count")):
                totals = latencies.setdefault(histograms[family.name], [0.0, 0.0])
                totals[0 if sample.name.endswith("_sum") else 1] += sample.value
    return counters, latencies

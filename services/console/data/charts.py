"""The live charts' data: one snapshot of the services' Prometheus endpoints (scraped by
services/console/metrics.py). Counters, and latency histograms' cumulative buckets and
count, are returned as totals: the browser keeps a bounded ring of snapshots and draws
rates and latency percentiles (p50, p99) from the difference of consecutive ones (the
console keeps nothing). Metric names: docs/operations.md, "Metrics"."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from services.console.data.limits import METRICS_SCRAPE_THREADS
from services.console.metrics import Samples, ScrapeError, total
from services.console.metrics import parse as parse_samples
from services.console.metrics import scrape as scrape_samples

# Throughput series: key -> (label, the counter's sample name), summed over labels.
COUNTERS: dict[str, tuple[str, str]] = {
    "produced": ("produced messages/s (gateway)", "tide_gateway_produced_messages_total"),
    "pulled": ("pulled messages/s (gateway)", "tide_gateway_pulled_messages_total"),
    "pop_received": ("POP received messages/s (dispatch)", "tide_dispatch_pop_received_total"),
    "appended": ("appended messages/s (storage)", "tide_storage_appended_messages_total"),
}
# Latency series: key -> (label, the histogram's name): p50 and p99 of each interval's
# calls, from its buckets' increase.
LATENCIES: dict[str, tuple[str, str]] = {
    "produce_latency": (
        "produce latency p50 / p99 (gateway)",
        "tide_gateway_produce_latency_seconds",
    ),
    "append_latency": ("append latency p50 / p99 (storage)", "tide_storage_append_latency_seconds"),
}


@dataclass(frozen=True)
class EndpointSnapshot:
    name: str
    endpoint: str
    # "" when scraped; else why not (the page shows it).
    error: str = ""
    counters: dict[str, float] = field(default_factory=dict)
    # key -> [[upper bound in seconds, calls at or under it], ...] (cumulative, finite
    # bounds ascending, summed over labels), then [None, all calls] (the +Inf bucket: JSON
    # has no infinity).
    latencies: dict[str, list[list[float | None]]] = field(default_factory=dict)


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
        samples = scrape_samples(endpoint)
    except ScrapeError as exc:
        return EndpointSnapshot(name, endpoint, str(exc))
    counters, latencies = figures(samples)
    return EndpointSnapshot(name, endpoint, "", counters, latencies)


def parse(text: str) -> tuple[dict[str, float], dict[str, list[list[float | None]]]]:
    """The COUNTERS and LATENCIES found in a text exposition."""
    return figures(parse_samples(text))


def figures(samples: Samples) -> tuple[dict[str, float], dict[str, list[list[float | None]]]]:
    """The COUNTERS (summed over their labels) and LATENCIES' buckets found in ``samples``."""
    counters = {
        key: value
        for key, (_, name) in COUNTERS.items()
        if (value := total(samples, name)) is not None
    }
    latencies = {
        key: found for key, (_, name) in LATENCIES.items() if (found := buckets(samples, name))
    }
    return counters, latencies


def buckets(samples: Samples, histogram: str) -> list[list[float | None]]:
    """A histogram's cumulative buckets summed over its other labels (see EndpointSnapshot)."""
    by_bound: dict[float, float] = {}
    for sample in samples.get(f"{histogram}_bucket", []):
        bound = float(sample.labels.get("le", "+Inf"))
        by_bound[bound] = by_bound.get(bound, 0.0) + sample.value
    count = total(samples, f"{histogram}_count")
    if count is None:
        return []
    finite: list[list[float | None]] = [
        [bound, calls] for bound, calls in sorted(by_bound.items()) if not math.isinf(bound)
    ]
    return [*finite, [None, count]]

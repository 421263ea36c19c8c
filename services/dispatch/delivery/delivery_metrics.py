"""The delivery services' metrics (decision 7 of issue 18): one lateness histogram for
both kinds, and the timer's pending gauge.

``tide_dispatch_delivery_lateness_ms``: how long after its due time a message was
appended to its real topic, attribute ``kind`` = ``delay_level`` or ``timer``.
``tide_dispatch_timer_pending``: timed messages filed and not delivered yet.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from opentelemetry.metrics import Histogram

from tide.server._metrics import Sample, SampledGauges, service_meter

# Lateness buckets (ms): a precision of 100 ms to 1 s, and a backlog of minutes.
LATENESS_BUCKETS_MS = (10, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 60_000, 600_000)


@cache
def _lateness_histogram() -> Histogram:
    # One instrument for both kinds (created once, whichever service asks first).
    return service_meter("dispatch").create_histogram(
        "tide_dispatch_delivery_lateness_ms",
        unit="ms",
        description="how long after its due time a delayed or timed message was re-put "
        "to its real topic",
        explicit_bucket_boundaries_advisory=list(LATENESS_BUCKETS_MS),
    )


def lateness_recorder(kind: str) -> Callable[[int], None]:
    """Records one delivery's lateness (ms) under ``kind``."""
    histogram = _lateness_histogram()
    attributes = {"kind": kind}

    def record(lateness_ms: int) -> None:
        histogram.record(lateness_ms, attributes)

    return record


def timer_gauges(pending: Callable[[], int]) -> SampledGauges:
    """The timer's pending gauge (started by the caller)."""

    def sample() -> Sample:
        return {"tide_dispatch_timer_pending": pending()}

    gauges = SampledGauges(service_meter("dispatch"), sample)
    gauges.gauge("tide_dispatch_timer_pending", "timed messages filed, not delivered yet")
    return gauges

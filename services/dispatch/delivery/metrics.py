"""Metrics every delivery service shares (decision 7 of issue 18, docs/delivery.md).

``tide_dispatch_delivery_lateness_milliseconds{kind}``: for each delivered copy, the store time of
the copy minus the time it was due (``kind`` is ``delay_level`` or ``timer``).
``tide_dispatch_delivery_undeliverable_total{kind}``: due messages that could not be
delivered and never will (no ``REAL_TOPIC``, the store refused the copy as invalid, the
real topic is gone); each is logged.

The instruments are created once per process (the meter would warn on a second
creation) and recorded per appended batch, off any produce path.
"""

from __future__ import annotations

import functools

from opentelemetry.metrics import Counter, Histogram

from tide.server._metrics import service_meter

# Lateness buckets in ms: a timer's precision is 100 ms .. 1 s, a loaded box adds seconds.
LATENESS_BUCKETS_MS: tuple[float, ...] = (
    10, 50, 100, 250, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 300_000
)  # fmt: skip
KIND_DELAY_LEVEL = "delay_level"
KIND_TIMER = "timer"


@functools.cache
def lateness_histogram() -> Histogram:
    return service_meter("dispatch").create_histogram(
        "tide_dispatch_delivery_lateness_milliseconds",
        unit="ms",
        description="store time of a delivered copy minus the time it was due",
        explicit_bucket_boundaries_advisory=list(LATENESS_BUCKETS_MS),
    )


@functools.cache
def undeliverable_counter() -> Counter:
    return service_meter("dispatch").create_counter(
        "tide_dispatch_delivery_undeliverable_total",
        unit="1",
        description="due messages that cannot be delivered (logged; progress moves past them)",
    )

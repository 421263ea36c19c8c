"""The timer's gauge (decision 7 of issue 18): ``tide_dispatch_timer_pending``, timed
messages filed and not delivered yet. Its lateness goes to the shared histogram
``tide_dispatch_delivery_lateness_milliseconds{kind="timer"}``, recorded by the re-put
(services/dispatch/delivery/metrics.py)."""

from __future__ import annotations

from collections.abc import Callable

from tide.server._metrics import Sample, SampledGauges, service_meter


def timer_gauges(pending: Callable[[], int]) -> SampledGauges:
    """The timer's pending gauge (started and stopped by the caller)."""

    def sample() -> Sample:
        return {"tide_dispatch_timer_pending": pending()}

    gauges = SampledGauges(service_meter("dispatch"), sample)
    gauges.gauge("tide_dispatch_timer_pending", "timed messages filed, not delivered yet")
    return gauges

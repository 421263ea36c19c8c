"""Helpers for the services' OpenTelemetry metrics (``services/*/metrics.py``).

Names carry their unit (``tide_storage_append_latency_seconds``, ``..._bytes_total``).
Hot paths stay cheap: a total is a plain number the hot path adds to (one attribute
update, each total updated from one thread only) reported by an observable counter
(:func:`observable_total`), and a latency is at most one SDK histogram record per call
or batch (a few microseconds). Every gauge is computed off the hot path by a
:class:`SampledGauges`: a sample function runs on the service's event loop every
``interval_s`` (so it may read the service's state like any handler, without locks) and
the exporter's thread (the Prometheus endpoint, the OTLP reader) only reads the last
sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

# Latency buckets in seconds: 100 us .. 10 s.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
SAMPLE_INTERVAL_S = 1.0

Attributes = Mapping[str, str | int]
# A gauge's value: one number, or (number, attributes) points.
GaugeValue = float | int | Sequence[tuple[float | int, Attributes]]
Sample = Mapping[str, GaugeValue]
SampleFn = Callable[[], Sample | Awaitable[Sample]]

_log = logging.getLogger("tide.server.metrics")


def observable_total(
    meter: Meter,
    name: str,
    read: Callable[[], float | int | Mapping[str, float | int]],
    description: str,
    unit: str = "1",
    label: str = "",
) -> None:
    """An observable counter reporting ``read()``: one number, or a number per value of
    ``label`` (e.g. pull results by status)."""

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        value = read()
        if isinstance(value, int | float):
            return [Observation(value)]
        return [Observation(number, {label: key}) for key, number in list(value.items())]

    meter.create_observable_counter(name, callbacks=[observe], unit=unit, description=description)


def service_meter(service: str) -> Meter:
    """The meter of a service (``tide.storage``...), from the global provider."""
    return metrics.get_meter(f"tide.{service}")


class SampledGauges:
    """Observable gauges whose values ``sample`` computes on the event loop."""

    def __init__(self, meter: Meter, sample: SampleFn, interval_s: float = SAMPLE_INTERVAL_S):
        self._meter = meter
        self._sample = sample
        self._interval_s = interval_s
        self._values: Sample = {}
        self._task: asyncio.Task[None] | None = None

    def gauge(self, name: str, description: str, unit: str = "1") -> None:
        """Declare a gauge; ``sample`` returns its value under ``name``."""
        self._meter.create_observable_gauge(
            name, callbacks=[partial(self._observe, name)], unit=unit, description=description
        )

    def _observe(self, name: str, options: CallbackOptions) -> Iterable[Observation]:
        value = self._values.get(name)  # one dict read: the loop swaps whole samples
        if value is None:
            return []
        if isinstance(value, int | float):
            return [Observation(value)]
        return [Observation(number, dict(attributes)) for number, attributes in value]

    async def sample_now(self) -> None:
        try:
            result = self._sample()
            if inspect.isawaitable(result):
                result = await result
            self._values = dict(result)
        except Exception:  # a gauge must never take a service down
            _log.warning("sampling gauges failed", exc_info=True)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await self.sample_now()
            await asyncio.sleep(self._interval_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class RpcMetrics:
    """Per-service RPC errors, recorded by the server interceptor (on the error path only):
    ``tide_<service>_rpc_errors_total{rpc_method,grpc_code}``."""

    def __init__(self, service: str) -> None:
        meter = service_meter(service)
        self.errors = meter.create_counter(
            f"tide_{service}_rpc_errors_total",
            unit="1",
            description="calls that ended with an error status, by method and status code",
        )


def short_service_name(grpc_service: str) -> str:
    """``tide.v1.NameServer`` -> ``nameserver``."""
    return grpc_service.rpartition(".")[2].lower()

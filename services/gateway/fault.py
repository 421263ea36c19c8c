"""Latency fault tolerance for Produce (RocketMQ's MQFaultStrategy + LatencyFaultToleranceImpl).

After every Append the gateway records how long the broker took. A slow answer makes the
broker unavailable for a while, by RocketMQ's table::

    latency >=  50 ms   100 ms   550 ms   1 s    2 s     3 s     15 s
    avoided     0        0        30 s     60 s   120 s   180 s   600 s

and a failed call (unreachable, timed out) makes it unavailable for the isolation time.
Queue selection skips unavailable brokers while others exist; a later fast answer makes
the broker available again at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

LATENCY_MAX_MS: tuple[int, ...] = (50, 100, 550, 1_000, 2_000, 3_000, 15_000)
NOT_AVAILABLE_MS: tuple[int, ...] = (0, 0, 30_000, 60_000, 120_000, 180_000, 600_000)
# Brokers tracked at most (the least recently updated go first); a cluster has far fewer.
MAX_TRACKED_BROKERS = 4096


def not_available_duration_ms(latency_ms: float) -> int:
    """How long a broker that answered in ``latency_ms`` is avoided (RocketMQ's table)."""
    for limit, duration in zip(reversed(LATENCY_MAX_MS), reversed(NOT_AVAILABLE_MS), strict=True):
        if latency_ms >= limit:
            return duration
    return 0


@dataclass(slots=True)
class FaultItem:
    broker_name: str
    latency_ms: float
    available_from_ms: float


class LatencyFaultTolerance:
    """Per broker name: the last latency and when the broker is available again."""

    def __init__(
        self,
        *,
        enabled: bool = True,
        isolation_ms: int = 30_000,
        clock_ms: Callable[[], float] | None = None,
    ) -> None:
        self.enabled = enabled
        self.isolation_ms = isolation_ms
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000)
        self._items: dict[str, FaultItem] = {}

    def update(self, broker_name: str, latency_ms: float, *, isolation: bool = False) -> None:
        """Record an Append's outcome: its latency, or ``isolation`` for a failure."""
        if not self.enabled:
            return
        duration = self.isolation_ms if isolation else not_available_duration_ms(latency_ms)
        now = self._clock_ms()
        self._items.pop(broker_name, None)  # re-insert: the dict keeps update order
        self._items[broker_name] = FaultItem(broker_name, latency_ms, now + duration)
        while len(self._items) > MAX_TRACKED_BROKERS:
            del self._items[next(iter(self._items))]

    def is_available(self, broker_name: str) -> bool:
        if not self.enabled:
            return True
        item = self._items.get(broker_name)
        return item is None or self._clock_ms() >= item.available_from_ms

    def least_bad(self, broker_names: Iterable[str]) -> str | None:
        """Of ``broker_names``, the one available soonest (RocketMQ's pickOneAtLeast)."""
        best: str | None = None
        best_key = (float("inf"), float("inf"))
        for name in broker_names:
            item = self._items.get(name)
            key = (0.0, 0.0) if item is None else (item.available_from_ms, item.latency_ms)
            if key < best_key:
                best, best_key = name, key
        return best

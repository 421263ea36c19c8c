"""Latency histograms (HdrHistogram, microseconds, 3 significant digits) and their
percentile summaries."""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import Any

from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # one hour
SIGNIFICANT_DIGITS = 3
# The percentiles every report shows: (JSON key, label, percentile).
PERCENTILES: tuple[tuple[str, str, float], ...] = (
    ("p50", "p50", 50.0),
    ("p95", "p95", 95.0),
    ("p99", "p99", 99.0),
    ("p999", "p99.9", 99.9),
)
SUMMARY_KEYS = ("count", "mean", *(key for key, _, _ in PERCENTILES), "max")


def new_histogram() -> Any:
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)


class Latency:
    """A latency histogram in microseconds with an interval part: :meth:`record` goes to
    the interval, :meth:`tick` folds the interval into the total and returns the
    interval's summary (for a timeline). The sum of the values is kept as well, so the
    mean is exact."""

    def __init__(self) -> None:
        self.total: Any = new_histogram()
        self._interval: Any = new_histogram()
        self._pending = 0
        self._total_sum_us = 0
        self._interval_sum_us = 0

    def record(self, micros: int, count: int = 1) -> None:
        """One value (or ``count`` equal ones); clamped to the histogram's range."""
        if micros < LOWEST_US:
            micros = LOWEST_US
        elif micros > HIGHEST_US:
            micros = HIGHEST_US
        self._interval.record_value(micros, count)
        self._pending += count
        self._interval_sum_us += micros * count

    def tick(self) -> dict[str, float]:
        """Fold the values since the last tick into the total; their summary."""
        interval = self._interval
        summary = summarize(interval, self._interval_sum_us)
        if self._pending:
            self.total.add(interval)
            self._total_sum_us += self._interval_sum_us
            self._interval = new_histogram()
            self._pending = 0
            self._interval_sum_us = 0
        return summary

    def take(self) -> tuple[Any, int]:
        """The values recorded since the last take or tick (histogram, sum in us), and
        forget them: what a worker process sends to the main one."""
        taken = self._interval, self._interval_sum_us
        self._interval = new_histogram()
        self._pending = 0
        self._interval_sum_us = 0
        return taken

    def add(self, histogram: Any, sum_us: int) -> None:
        """Values recorded elsewhere (another process's :meth:`take`), into the interval."""
        count = int(histogram.get_total_count())
        if count:
            self._interval.add(histogram)
            self._pending += count
            self._interval_sum_us += sum_us

    def reset(self) -> None:
        """Forget everything (the end of the warm-up)."""
        self.total = new_histogram()
        self._interval = new_histogram()
        self._pending = 0
        self._total_sum_us = 0
        self._interval_sum_us = 0

    def summary(self) -> dict[str, float]:
        """The total's summary, after folding in the current interval."""
        self.tick()
        return summarize(self.total, self._total_sum_us)


def percentile_values(histogram: Any, percentiles: list[float]) -> list[int]:
    """The values at ``percentiles`` as hdrh's ``get_value_at_percentile`` gives them, in
    one C-level pass over the counts (hdrh's own walks them in Python: ~25 ms)."""
    cumulative = list(accumulate(histogram.counts))
    values = []
    for percentile in percentiles:
        target = histogram.get_target_count_at_percentile(percentile)
        index = min(bisect_left(cumulative, target), len(cumulative) - 1)
        values.append(histogram.get_highest_equivalent_value(histogram.get_value_from_index(index)))
    return values


def summarize(histogram: Any, sum_us: int | None = None) -> dict[str, float]:
    """count, mean, p50, p95, p99, p99.9 and max, in milliseconds (count as a number);
    all zero for an empty histogram. The mean is ``sum_us / count`` when the sum is given
    (else hdrh's estimate, which is slow)."""
    count = int(histogram.get_total_count())
    summary: dict[str, float] = {"count": count}
    if count == 0:
        summary.update({key: 0.0 for key in SUMMARY_KEYS if key != "count"})
        return summary
    mean_us = sum_us / count if sum_us is not None else histogram.get_mean_value()
    summary["mean"] = round(mean_us / 1000, 3)
    values = percentile_values(histogram, [p for _, _, p in PERCENTILES])
    for (key, _, _), value in zip(PERCENTILES, values, strict=True):
        summary[key] = round(value / 1000, 3)
    summary["max"] = round(histogram.get_max_value() / 1000, 3)
    return summary


def percentile_curve(histogram: Any) -> list[tuple[float, float]]:
    """(percentile, ms) points of the whole distribution, for a plot."""
    if histogram.get_total_count() == 0:
        return []
    points = []
    for item in histogram.get_percentile_iterator(5):
        points.append((float(item.percentile_level_iterated_to), item.value_iterated_to / 1000))
    return points

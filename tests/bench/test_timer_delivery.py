"""``bench.timer_delivery`` scaled down to a smoke run: a real cluster (name server,
storage, dispatch, gateway processes), 2,000 timed messages due over 3 s produced through
the gateway (and, in ``append`` mode, straight to the storage), every one delivered once
and the report filled in (the figures themselves are for docs/benchmarks.md, not
asserted: a shared box)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.timer_delivery import MODES, parse_args, run
from tide.format import DEFAULT_TIMER_PRECISION_MS


@pytest.mark.parametrize("mode", MODES)
def test_quick_run_delivers_every_timed_message_and_reports(tmp_path: Path, mode: str) -> None:
    args = parse_args(["--count", "2000", "--spread-s", "3", "--lead-s", "3", "--mode", mode])
    report = run(args, tmp_path)
    assert report.mode == mode
    assert report.timer_precision_ms == DEFAULT_TIMER_PRECISION_MS == 500  # as the dispatch said
    assert (report.delivered, report.lost, report.duplicates) == (2000, 0, 0)
    assert report.lateness_min_ms >= 0  # none delivered before it was due
    assert report.lateness_max_ms >= report.lateness_p99_ms >= report.lateness_p50_ms
    assert report.timed_rate > 0 and report.normal_rate > 0 and report.rate_ratio > 0
    assert report.storage_peak_rss_bytes > 0 and report.dispatch_peak_rss_bytes > 0
    assert report.dispatch_max_sampled_rss_bytes <= report.dispatch_peak_rss_bytes
    assert 0 < report.dispatch_max_sampled_anon_bytes <= report.dispatch_max_sampled_rss_bytes
    services = {"nameserver", "storage", "dispatch", "gateway", "client"}
    assert set(report.produce_cpu_us_per_message) == services
    assert report.produce_cpu_us_per_message["storage"] > 0  # every message was appended
    assert report.delivery_cpu_s["dispatch"] > 0  # the timer delivered them


def test_batch_outside_the_clients_limit_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--batch", "0"])

"""``bench.timer_delivery`` scaled down to a smoke run: real storage + dispatch processes,
2,000 timed messages due over 3 s, every one delivered once and the report filled in
(the figures themselves are for docs/benchmarks.md, not asserted: a shared box)."""

from __future__ import annotations

from pathlib import Path

from bench.timer_delivery import parse_args, run


def test_quick_run_delivers_every_timed_message_and_reports(tmp_path: Path) -> None:
    args = parse_args(["--count", "2000", "--spread-s", "3", "--lead-s", "3"])
    report = run(args, tmp_path)
    assert (report.delivered, report.lost, report.duplicates) == (2000, 0, 0)
    assert report.lateness_min_ms >= 0  # none delivered before it was due
    assert report.lateness_max_ms >= report.lateness_p99_ms >= report.lateness_p50_ms
    assert report.timed_rate > 0 and report.normal_rate > 0 and report.rate_ratio > 0
    assert report.storage_peak_rss_bytes > 0 and report.dispatch_peak_rss_bytes > 0
    assert report.dispatch_max_sampled_rss_bytes <= report.dispatch_peak_rss_bytes
    assert 0 < report.dispatch_max_sampled_anon_bytes <= report.dispatch_max_sampled_rss_bytes

"""``tide bench`` through the real entry point, in subprocesses: a short run against a real
cluster (counts add up, the JSON has every field, --plot writes a PNG, the topics are
deleted), the baseline and its ratio, ``list`` and usage errors. Tiny rates, no timing
assertions."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests._cluster import Cluster, cluster_fixture
from tide.bench._stats import SUMMARY_KEYS
from tide.bench._workload import field_names
from tide.client import Admin, PullConsumer
from tide.waiting import WaitTimeout, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RUN_KEYS = {
    "kind", "workload", "gateway", "started_at", "topics", "queues", "measured_s", "publish",
    "consume", "backlog", "publish_latency_ms", "e2e_latency_ms", "totals", "errors",
    "last_error", "ok", "client_cpu", "machine", "timeline", "publish_percentiles",
    "e2e_percentiles", "baseline", "ratio_to_baseline", "client_processes",
    "window_monotonic_s",
}  # fmt: skip
TOTALS_KEYS = {
    "published", "consumed", "publish_calls", "publish_errors", "send_failed",
    "consume_errors", "offset_resets", "drain_s",
}  # fmt: skip
SAMPLE_KEYS = {
    "t_s", "measuring", "publish_rate", "consume_rate", "backlog", "publish_p50_ms",
    "publish_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
}  # fmt: skip
BASELINE_KEYS = {
    "kind", "workload", "server", "measured_s", "publish", "publish_latency_ms", "errors",
    "last_error", "client_cpu", "server_cpu", "machine", "client_processes",
}  # fmt: skip

cluster = cluster_fixture(brokers=2)

TINY = """\
description: a test run
topics: 2
queues_per_topic: 2
message_size: 64
batch_size: 5
producers_per_topic: 1
inflight: 2
consumers_per_topic: 2
rate: 200
warmup_s: 0.5
duration_s: 1.5
"""


def tide(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tide.cli", *map(str, args)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def tiny_workload(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def check_summary(summary: dict[str, Any]) -> None:
    assert set(summary) == set(SUMMARY_KEYS)
    assert summary["count"] > 0
    assert 0 < summary["p50"] <= summary["p95"] <= summary["p99"] <= summary["p999"]
    assert summary["p999"] <= summary["max"]


def test_run_json_plot_and_baseline(cluster: Cluster, tmp_path: Path) -> None:
    plot = tmp_path / "run.png"
    report = json.loads(
        ok(
            tide(
                "bench", "run", tiny_workload(tmp_path), "--gateway", cluster.gateway.listen,
                "--json", "--plot", plot, "--baseline", "--baseline-duration-s", "0.5",
            )
        )
    )  # fmt: skip
    assert set(report) == RUN_KEYS
    assert report["kind"] == "run"
    assert report["workload"]["name"] == "tiny"
    assert set(report["workload"]) == set(field_names())
    assert report["gateway"] == cluster.gateway.listen
    assert report["queues"] == 2 * 2 * 2  # per topic: 2 queues on each of 2 brokers

    totals = report["totals"]
    assert set(totals) == TOTALS_KEYS
    assert totals["published"] > 0
    assert totals["published"] == totals["consumed"]
    assert totals["publish_calls"] * 5 == totals["published"]
    for key in ("publish_errors", "send_failed", "consume_errors", "offset_resets"):
        assert totals[key] == 0, report["last_error"]
    assert report["errors"] == 0
    assert report["ok"] is True
    assert report["last_error"] == ""

    for part in ("publish", "consume"):
        assert set(report[part]) == {"messages", "msgs_per_s", "mb_per_s"}
        assert 0 < report[part]["messages"] <= totals["published"]
        assert report[part]["msgs_per_s"] > 0
    assert report["measured_s"] > 0
    # the window on the system's monotonic clock (another process's time.monotonic())
    start, end = report["window_monotonic_s"]
    assert start < end < time.monotonic()
    assert end - start == pytest.approx(report["measured_s"], abs=0.002)
    assert set(report["backlog"]) == {"end", "max"}
    check_summary(report["publish_latency_ms"])
    check_summary(report["e2e_latency_ms"])
    assert report["e2e_latency_ms"]["count"] <= totals["consumed"]
    assert set(report["client_cpu"]) == {"cpu_s", "core_share", "us_per_msg"}
    assert report["machine"]["cpus"]
    assert report["timeline"]
    for point in report["timeline"]:
        assert set(point) == SAMPLE_KEYS
    assert any(point["measuring"] for point in report["timeline"])
    assert sum(1 for point in report["timeline"] if point["publish_rate"] > 0)
    assert report["publish_percentiles"][-1][0] == 100.0
    assert report["e2e_percentiles"][-1][0] == 100.0

    baseline = report["baseline"]
    assert set(baseline) == BASELINE_KEYS
    assert baseline["kind"] == "baseline"
    assert baseline["errors"] == 0
    assert baseline["publish"]["messages"] > 0
    assert baseline["publish"]["msgs_per_s"] > 0
    check_summary(baseline["publish_latency_ms"])
    assert report["ratio_to_baseline"] > 0
    expected = report["publish"]["msgs_per_s"] / baseline["publish"]["msgs_per_s"]
    assert abs(report["ratio_to_baseline"] - expected) < 1e-3

    assert plot.read_bytes().startswith(PNG_MAGIC)
    with Admin(cluster.gateway.listen) as admin:
        left = set(admin.list_topics())
    assert not left & set(report["topics"])  # deleted after the run


def test_run_table_keep_topics_and_set(cluster: Cluster, tmp_path: Path) -> None:
    result = tide(
        "bench", "run", tiny_workload(tmp_path), "--gateway", cluster.gateway.listen,
        "--set", "topics=1", "--set", "warmup_s=0", "--set", "duration_s=1", "--keep-topics",
    )  # fmt: skip
    out = ok(result)
    assert out.startswith("workload tiny: 1 topic(s) x 2 queues per broker")
    lines = out.splitlines()
    assert next(line for line in lines if line.startswith("publish ")).split()[-1] != "0"
    assert any(line.startswith("end-to-end") for line in lines)
    assert "errors 0" in out
    assert "NOT OK" not in out
    assert "tide bench: measuring for 1 s" in result.stderr
    with Admin(cluster.gateway.listen) as admin:
        kept = [t for t in admin.list_topics() if t.startswith("bench-tiny-")]
        assert kept
        for topic in kept:
            admin.delete_topic(topic)


def stored_messages(cluster: Cluster, topic: str, expected: int) -> int:
    """The messages in the topic's queues, once the dispatch has them all (or 30 s: the
    caller compares)."""
    seen = [0]
    with PullConsumer("test-bench-offsets", cluster.gateway.listen) as consumer:

        def all_stored() -> bool:
            offsets = [consumer.offsets(queue) for queue in consumer.queues(topic)]
            seen[0] = sum(item.max_offset - item.min_offset for item in offsets)
            return seen[0] >= expected

        with contextlib.suppress(WaitTimeout):
            wait_until(all_stored, f"{expected} messages stored in {topic}")
    return seen[0]


def test_producer_only_run(cluster: Cluster, tmp_path: Path) -> None:
    """consumers_per_topic 0: the messages are published and counted, nothing consumes
    them, the run is OK, and the table has no consume side."""
    args = ("bench", "run", tiny_workload(tmp_path), "--gateway", cluster.gateway.listen,
            "--set", "consumers_per_topic=0", "--set", "topics=1", "--set", "warmup_s=0",
            "--set", "duration_s=1")  # fmt: skip
    report = json.loads(ok(tide(*args, "--json", "--keep-topics")))
    totals = report["totals"]
    assert totals["published"] > 0
    assert totals["published"] == totals["publish_calls"] * 5
    assert totals["consumed"] == 0
    assert report["consume"]["messages"] == 0
    assert report["e2e_latency_ms"]["count"] == 0
    check_summary(report["publish_latency_ms"])
    assert report["errors"] == 0
    assert report["ok"] is True
    (topic,) = report["topics"]
    assert stored_messages(cluster, topic, totals["published"]) == totals["published"]
    with Admin(cluster.gateway.listen) as admin:
        admin.delete_topic(topic)
    out = ok(tide(*args, "--quiet"))
    assert "no consumers: a producer-only run" in out
    assert not any(line.startswith(("consume ", "end-to-end")) for line in out.splitlines())


def test_baseline_alone(tmp_path: Path) -> None:
    out = ok(tide("bench", "baseline", tiny_workload(tmp_path), "--duration-s", "0.5", "--quiet"))
    assert out.startswith("baseline for tiny:")
    assert "echo (call)" in out
    report = json.loads(
        ok(tide("bench", "baseline", tiny_workload(tmp_path), "--duration-s", "0.5", "--json"))
    )
    assert set(report) == BASELINE_KEYS
    assert report["publish"]["messages"] > 0
    assert report["errors"] == 0


def test_list_shipped_workloads() -> None:
    out = ok(tide("bench", "list"))
    names = [line.split()[0] for line in out.splitlines()[1:]]
    assert "1-topic-4-queues-128b-batch100" in names
    assert "e2e-latency-5k" in names
    listed = json.loads(ok(tide("bench", "list", "--json")))
    assert {item["name"] for item in listed} == set(names)


def test_usage_errors(tmp_path: Path) -> None:
    missing = tide("bench", "run", "no-such-workload", "--gateway", "127.0.0.1:1")
    assert missing.returncode == 2
    assert "no workload file 'no-such-workload'" in missing.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("batch_size = 0\n")
    invalid = tide("bench", "run", bad, "--gateway", "127.0.0.1:1")
    assert invalid.returncode == 2
    assert "batch_size is 0" in invalid.stderr
    override = tide("bench", "baseline", tiny_workload(tmp_path), "--set", "inflight=x")
    assert override.returncode == 2
    assert "inflight=x" in override.stderr

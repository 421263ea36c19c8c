"""``produce_api: stream``: the benchmarks' producers on ProduceStream (tide bench, its
echo baseline, and bench/gateway_produce_pull.py), against a real cluster (a few s)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gateway_produce_pull import TOPIC, produce_phase
from tests._cluster import Cluster, cluster_fixture
from tide.bench import Workload, WorkloadError, apply_overrides, load_workload, run_workload
from tide.bench._workload import PRODUCE_APIS

stream_cluster = cluster_fixture(name="stream_cluster", brokers=1)

WORKLOADS = Path(__file__).resolve().parents[2] / "bench" / "workloads"


def test_produce_api_is_checked_and_can_be_overridden() -> None:
    assert PRODUCE_APIS == ("unary", "stream")
    assert Workload(name="w").produce_api == "unary"
    with pytest.raises(WorkloadError, match="produce_api is 'grpc'; give one of unary, stream"):
        Workload(name="w", produce_api="grpc")
    changed = apply_overrides(Workload(name="w"), ["produce_api=stream"])
    assert changed.produce_api == "stream"
    assert "on a ProduceStream" in changed.summary()
    assert "ProduceStream" not in Workload(name="w").summary()
    shipped = load_workload("1-topic-4-queues-128b-batch100-stream", WORKLOADS)
    assert (shipped.produce_api, shipped.batch_size) == ("stream", 100)


def test_tide_bench_run_on_a_produce_stream(stream_cluster: Cluster) -> None:
    workload = Workload(
        "stream",
        queues_per_topic=2,
        batch_size=10,
        inflight=8,
        produce_api="stream",
        warmup_s=0.3,
        duration_s=1.0,
        long_poll_ms=500,
        # small pulls that grow while the consumer is behind: still every message once
        pull_batch=8,
        pull_batch_max=64,
    )
    report = run_workload(workload, stream_cluster.gateway.listen)
    assert report["ok"], report["last_error"]
    totals = report["totals"]
    assert totals["published"] == totals["consumed"] > 0
    assert totals["publish_errors"] == 0 and totals["send_failed"] == 0
    assert totals["published"] == totals["publish_calls"] * 10
    latency = report["publish_latency_ms"]
    # Answers still due when the window closes are timed but counted after it.
    calls = report["publish"]["messages"] // 10
    assert calls <= latency["count"] <= calls + workload.inflight


def test_gateway_bench_produce_phase_on_a_stream(stream_cluster: Cluster) -> None:
    stream_cluster.create_topic(TOPIC, queues=2)
    result = asyncio.run(
        produce_phase(
            stream_cluster.gateway.listen, inflight=4, duration_s=1.0, producers=1, api="stream"
        )
    )
    assert result["messages"] > 0 and result["messages"] == result["calls"] * 100
    assert 0 < result["p50_ms"] <= result["p99_ms"]


def test_cli_baseline_on_a_stream() -> None:
    tide = Path(sys.executable).with_name("tide")
    result = subprocess.run(
        [
            *(str(tide), "bench", "baseline", "single-message-1k", "--json", "--quiet"),
            *("--produce-api", "stream", "--set", "inflight=4", "--duration-s", "0.5"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["workload"]["produce_api"] == "stream"
    assert report["publish"]["messages"] > 0 and report["errors"] == 0

"""``producer_processes`` / ``consumer_processes``: the producers and consumers of a run in
OS processes of their own, their counts and latency histograms merged into one report
(against a real cluster, a few seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hdrh.histogram import HdrHistogram

from tests._cluster import Cluster, cluster_fixture
from tests._stalls import StallProbe
from tide.bench import Workload, WorkloadError, run_workload, workload_from_mapping
from tide.bench._load import QueueRef
from tide.bench._procs import consumer_plans, producer_plans
from tide.bench._stats import Latency
from tide.bench._workload import MAX_PROCESSES

bench_cluster = cluster_fixture(name="bench_cluster", brokers=1)

RATE = 2_000.0
DURATION_S = 1.5
BATCH = 10


def test_plans_deal_producers_and_consumers_to_the_processes() -> None:
    workload = Workload(
        "w",
        topics=2,
        producers_per_topic=3,
        producer_processes=4,
        consumers_per_topic=2,
        consumer_processes=3,
        rate=1200.0,
        batch_size=10,
    )
    producers = producer_plans(workload, "127.0.0.1:1", ["t0", "t1"])
    assert [plan.topics for plan in producers] == [("t0", "t1"), ("t0", "t1"), ("t0",), ("t1",)]
    assert sum(len(plan.topics) for plan in producers) == workload.producers
    queues = [[QueueRef(topic, "broker-a", q) for q in range(4)] for topic in ("t0", "t1")]
    consumers = consumer_plans(workload, "127.0.0.1:1", queues, "g")
    dealt = [[[(r.topic, r.queue_id) for r in c] for c in plan.consumers] for plan in consumers]
    assert dealt == [
        [[("t0", 0), ("t0", 2)], [("t1", 1), ("t1", 3)]],
        [[("t0", 1), ("t0", 3)]],
        [[("t1", 0), ("t1", 2)]],
    ]
    text = workload.summary()
    assert "3 producer(s) x 1 in flight in 4 processes" in text
    assert "2 consumer(s) per topic in 3 processes" in text


def test_latency_take_and_add_move_values_between_processes() -> None:
    worker, main = Latency(), Latency()
    worker.record(1_000, 3)
    histogram, sum_us = worker.take()
    assert (histogram.get_total_count(), sum_us) == (3, 3_000)
    assert worker.summary()["count"] == 0  # taken, not kept
    main.add(HdrHistogram.decode(histogram.encode()), sum_us)
    main.record(4_000)
    summary = main.summary()
    assert summary["count"] == 4
    assert summary["mean"] == 1.75  # ms, from the exact sums
    assert summary["max"] == pytest.approx(4.0, rel=1e-3)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"producer_processes": 0}, "producer_processes is 0; give 1..16"),
        ({"producer_processes": 17}, "producer_processes is 17; give 1..16"),
        ({"producer_processes": 3, "producers_per_topic": 2}, "more than the 2 producer"),
        ({"consumer_processes": 0}, "consumer_processes is 0; give 1..16"),
        ({"consumer_processes": 2.0}, "consumer_processes is 2.0; give an integer"),
        ({"consumer_processes": 2, "topics": 1}, "more than the 1 consumer"),
    ],
)
def test_bad_process_counts_are_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        workload_from_mapping({"name": "w", **changes})
    assert MAX_PROCESSES == 16


def test_cli_refuses_a_bad_process_count() -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "tide.cli", "bench", "run", "single-message-1k"),
            *("--producer-processes", "17", "--gateway", "127.0.0.1:1"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "producer_processes is 17; give 1..16" in result.stderr


def test_cli_baseline_with_producer_processes() -> None:
    tide = Path(sys.executable).with_name("tide")  # the console script: spawn re-runs it
    result = subprocess.run(
        [
            *(str(tide), "bench", "baseline", "single-message-1k", "--json", "--quiet"),
            *("--set", "producers_per_topic=2", "--producer-processes", "2"),
            *("--duration-s", "0.5"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    roles = [p["role"] for p in report["client_processes"]]
    assert roles == ["main", "producer", "producer"]
    assert report["publish"]["messages"] == sum(
        p["window_published"] for p in report["client_processes"][1:]
    )
    assert report["publish"]["messages"] > 0 and report["errors"] == 0


def test_producers_and_consumers_in_processes_merge_into_one_report(
    bench_cluster: Cluster,
) -> None:
    workload = Workload(
        "procs",
        queues_per_topic=4,
        batch_size=BATCH,
        producers_per_topic=2,
        inflight=2,
        producer_processes=2,
        consumers_per_topic=2,
        consumer_processes=2,
        rate=RATE,
        warmup_s=0.5,
        duration_s=DURATION_S,
        long_poll_ms=500,
    )
    with StallProbe() as probe:
        report = run_workload(workload, bench_cluster.gateway.listen)
    assert report["ok"], report["last_error"]
    processes = report["client_processes"]
    assert [p["role"] for p in processes] == [
        "main",
        "producer",
        "producer",
        "consumer",
        "consumer",
    ]
    assert len({p["pid"] for p in processes}) == 5 and processes[0]["pid"] == os.getpid()
    assert (processes[0]["producers"], processes[0]["consumed_queues"]) == (0, 0)
    producers, consumers = processes[1:3], processes[3:]
    assert [p["producers"] for p in producers] == [1, 1]
    assert [(c["consumers"], c["queues"]) for c in consumers] == [(1, 2), (1, 2)]
    totals = report["totals"]
    # Every message and call is counted once, whole run and measured window alike.
    assert totals["published"] == sum(p["published"] for p in producers)
    assert totals["consumed"] == sum(c["consumed"] for c in consumers) == totals["published"]
    assert totals["publish_calls"] == sum(p["publish_calls"] for p in producers)
    window = report["publish"]["messages"]
    assert window == sum(p["window_published"] for p in producers)
    assert report["consume"]["messages"] == sum(c["window_consumed"] for c in consumers)
    latency = report["publish_latency_ms"]
    assert latency["count"] == sum(p["window_calls"] for p in producers)
    assert window == latency["count"] * BATCH  # every call answered SEND_OK
    # Each producer process paces its half of the rate: not the whole rate each (above),
    # nor much less than its half, less what a loaded box took from it: the time a
    # process here waited for a core (the stall probe; ~0 on a quiet box), up to all of it.
    expected = RATE * DURATION_S
    assert window <= 1.1 * expected + 2 * workload.inflight * BATCH
    stalled_s = min(probe.total_late_ms / 1000, DURATION_S)
    assert window >= 0.5 * RATE * (DURATION_S - stalled_s), (window, probe.total_late_ms)
    halves = [p["window_published"] for p in producers]
    assert abs(halves[0] - halves[1]) <= 0.2 * window + 0.5 * RATE * stalled_s, halves
    e2e = report["e2e_latency_ms"]
    assert e2e["count"] >= report["consume"]["messages"] > 0  # window start .. drained
    for summary in (latency, e2e):
        assert 0 < summary["p50"] <= summary["p99"] <= summary["p999"] <= summary["max"]
    assert report["client_cpu"]["cpu_s"] >= sum(p["window_cpu_s"] for p in processes) - 0.01
    # worker pools: the window the workers measured, on the system's monotonic clock
    start, end = report["window_monotonic_s"]
    assert end - start == pytest.approx(DURATION_S, abs=0.002)
    measured = [s for s in report["timeline"] if s["measuring"]]
    assert measured and sum(s["publish_rate"] for s in measured) > 0
    assert sum(s["consume_rate"] for s in measured) > 0

"""Metrics and traces of a real cluster: every service serves /metrics (port 0, named in
its ready file), the families exist and move with traffic, and one produce is one trace
across the gateway and the storage (spans read from the ``file`` exporter's JSON lines)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests._cluster import Cluster
from tests._metrics import SCRAPE_INTERVAL_S, families, scrape, total
from tests.observability._support import read_spans, telemetry_cluster
from tide.v1 import gateway_pb2 as pb
from tide.v1 import nameserver_pb2 as ns_pb
from tide.waiting import wait_until

TOPIC = "T_observability"


@pytest.fixture(scope="module")
def spans_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spans")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, spans_dir: Path) -> Iterator[Cluster]:
    """One broker (flushing in sync: the produce trace has a flush wait); the gateway logs
    JSON lines at debug level."""
    root = tmp_path_factory.mktemp("cluster")
    with telemetry_cluster(
        root,
        spans_dir,
        brokers=1,
        storage_args=("--flush", "sync"),
        gateway_args=("--log-format", "json", "--log-level", "debug"),
    ) as c:
        c.create_topic(TOPIC, queues=2)
        yield c


def processes(cluster: Cluster) -> dict[str, Any]:
    broker = cluster.brokers[0]
    return {
        "nameserver": cluster.nameservers[0],
        "storage": broker.storage,
        "dispatch": broker.dispatch,
        "gateway": cluster.gateway,
    }


def produce(cluster: Cluster, count: int, queue: int = 0) -> pb.ProduceResponse:
    messages = [
        pb.ProduceMessage(
            topic=TOPIC,
            body=b"x" * 100,
            keys=[f"k{i}"],
            queue=pb.QueueRef(broker_name="broker-a", queue_id=queue),
        )
        for i in range(count)
    ]
    reply: pb.ProduceResponse = cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=messages), timeout=20
    )
    assert all(r.status == pb.ProduceResult.SEND_OK for r in reply.results), reply
    return reply


def test_every_service_names_its_metrics_endpoint_in_the_ready_file(cluster: Cluster) -> None:
    for service, process in processes(cluster).items():
        address = process.ready.get("metrics")
        assert address and address.startswith("127.0.0.1:"), (service, process.ready)
        assert not address.endswith(":0")
        assert "target_info" in families(scrape(address)), service


STORAGE_FAMILIES = {
    "tide_storage_appended_messages_total",
    "tide_storage_appended_bytes_total",
    "tide_storage_append_latency_seconds_bucket",
    "tide_storage_append_lock_wait_seconds_total",
    "tide_storage_append_lock_acquisitions_total",
    "tide_storage_flush_latency_seconds_bucket",
    "tide_storage_fsyncs_total",
    "tide_storage_commitlog_min_offset_bytes",
    "tide_storage_commitlog_max_offset_bytes",
    "tide_storage_commitlog_flushed_offset_bytes",
    "tide_storage_segments",
    "tide_storage_disk_usage_ratio",
    "tide_storage_writable",
    "tide_storage_unconsumed_messages_deleted_total",
}
DISPATCH_FAMILIES = {
    "tide_dispatch_dispatched_offset_bytes",
    "tide_dispatch_lag_bytes",
    "tide_dispatch_lag_milliseconds",
    "tide_dispatch_consume_queues",
    "tide_dispatch_index_entries",
    "tide_dispatch_arrival_watchers",
    "tide_dispatch_disk_full",
    "tide_dispatch_delay_pending",
    "tide_dispatch_timer_pending",
}
GATEWAY_FAMILIES = {
    "tide_gateway_produced_messages_total",
    "tide_gateway_produced_bytes_total",
    "tide_gateway_produce_latency_seconds_bucket",
    "tide_gateway_pull_results_total",
    "tide_gateway_pulled_messages_total",
    "tide_gateway_held_pulls",
    "tide_gateway_rpc_errors_total",
}


def test_metrics_exist_and_move_with_traffic(cluster: Cluster) -> None:
    procs = processes(cluster)
    address = {name: process.ready["metrics"] for name, process in procs.items()}
    before = scrape(address["storage"])
    produce(cluster, 20, queue=1)
    reply: pb.PullResponse = cluster.gateway.stub.Pull(
        pb.PullRequest(
            consumer_group="g_obs",
            topic=TOPIC,
            broker_name="broker-a",
            queue_id=1,
            offset=0,
            max_messages=32,
        ),
        timeout=20,
    )
    assert reply.status == pb.PullResponse.FOUND
    cluster.gateway.stub.CommitOffset(
        pb.CommitConsumerOffsetRequest(
            consumer_group="g_obs", topic=TOPIC, broker_name="broker-a", queue_id=1, offset=5
        ),
        timeout=20,
    )
    # An error, counted by status code: an unknown topic.
    with pytest.raises(grpc.RpcError):
        cluster.gateway.stub.GetTopicRoute(ns_pb.GetTopicRouteRequest(topic="T_nope"), timeout=20)

    storage = scrape(address["storage"])
    assert families(storage) >= STORAGE_FAMILIES, STORAGE_FAMILIES - families(storage)
    grown = total(storage, "tide_storage_appended_messages_total") - total(
        before, "tide_storage_appended_messages_total"
    )
    assert grown >= 20
    assert total(storage, "tide_storage_appended_bytes_total") > total(
        before, "tide_storage_appended_bytes_total"
    )
    assert total(storage, "tide_storage_fsyncs_total") > 0  # --flush sync
    assert total(storage, "tide_storage_writable") == 1

    def max_offset_caught_up() -> bool:
        now = scrape(address["storage"])
        return total(now, "tide_storage_commitlog_max_offset_bytes") >= total(
            storage, "tide_storage_appended_bytes_total"
        )

    wait_until(
        max_offset_caught_up,
        "the sampled max offset to cover the appends",
        interval_s=SCRAPE_INTERVAL_S,
    )

    def dispatched() -> bool:
        now = scrape(address["dispatch"])
        return (
            families(now) >= DISPATCH_FAMILIES
            and total(now, "tide_dispatch_dispatched_offset_bytes") > 0
            and total(now, "tide_dispatch_index_entries") >= 20
        )

    wait_until(
        dispatched,
        "dispatch gauges to show the produced messages",
        state=lambda: {k: v for k, v in scrape(address["dispatch"]).items() if "tide_" in k},
        interval_s=SCRAPE_INTERVAL_S,
    )

    gateway = scrape(address["gateway"])
    assert families(gateway) >= GATEWAY_FAMILIES, GATEWAY_FAMILIES - families(gateway)
    assert total(gateway, "tide_gateway_produced_messages_total") >= 20
    assert total(gateway, "tide_gateway_pull_results_total", status="FOUND") >= 1
    assert total(gateway, "tide_gateway_pulled_messages_total") >= 20
    assert total(gateway, "tide_gateway_rpc_errors_total", rpc_method="GetTopicRoute") >= 1

    def lag_reported() -> bool:
        now = scrape(address["gateway"])
        return total(now, "tide_gateway_consumer_lag_messages", group="g_obs", queue="1") >= 15

    # The lag scan runs at start and then every 10 s.
    wait_until(
        lag_reported,
        "the consumer lag of g_obs on queue 1",
        timeout_s=30,
        interval_s=SCRAPE_INTERVAL_S,
    )

    nameserver = scrape(address["nameserver"])
    assert total(nameserver, "tide_nameserver_live_brokers", role="master") == 1
    assert total(nameserver, "tide_nameserver_topics") >= 1


def test_one_produce_is_one_trace_across_gateway_and_storage(
    cluster: Cluster, spans_dir: Path
) -> None:
    reply = produce(cluster, 3, queue=0)
    assert reply.results

    def produce_trace() -> list[dict[str, Any]] | None:
        spans = read_spans(spans_dir)
        for span in spans:
            if span["name"] == "tide.v1.Gateway/Produce" and span["service"] == "tide-gateway":
                trace = [s for s in spans if s["trace_id"] == span["trace_id"]]
                if any(s["name"] == "tide.v1.Storage/Append" for s in trace):
                    return trace
        return None

    wait_until(
        lambda: produce_trace() is not None,
        "a produce trace with a storage span",
        interval_s=SCRAPE_INTERVAL_S,
    )
    trace = produce_trace()
    assert trace is not None
    by_name = {span["name"]: span for span in trace}
    gateway = by_name["tide.v1.Gateway/Produce"]
    append = by_name["tide.v1.Storage/Append"]
    assert gateway["service"] == "tide-gateway" and gateway["kind"] == "SERVER"
    assert append["service"] == "tide-storage" and append["kind"] == "SERVER"
    assert append["parent_span_id"] == gateway["span_id"]  # the storage span is its child
    assert gateway["attributes"]["messaging.destination.name"] == TOPIC
    assert append["attributes"]["messaging.destination.name"] == TOPIC
    flush = by_name["storage.flush_wait"]  # --flush sync
    assert flush["parent_span_id"] == append["span_id"]


def test_one_pull_is_one_trace_across_gateway_dispatch_and_storage(
    cluster: Cluster, spans_dir: Path
) -> None:
    produce(cluster, 2, queue=0)
    reply: pb.PullResponse = cluster.gateway.stub.Pull(
        pb.PullRequest(
            consumer_group="g_trace", topic=TOPIC, broker_name="broker-a", queue_id=0, offset=0
        ),
        timeout=20,
    )
    assert reply.status == pb.PullResponse.FOUND

    def pull_trace() -> set[str]:
        spans = read_spans(spans_dir)
        for span in spans:
            if (
                span["name"] == "tide.v1.Gateway/Pull"
                and span["attributes"].get("messaging.consumer.group.name") == "g_trace"
            ):
                return {s["service"] for s in spans if s["trace_id"] == span["trace_id"]}
        return set()

    wait_until(
        lambda: {"tide-gateway", "tide-dispatch", "tide-storage"} <= pull_trace(),
        "a pull trace across the gateway, the dispatch and the storage",
        interval_s=SCRAPE_INTERVAL_S,
    )
    spans = read_spans(spans_dir)
    (pull,) = [
        s
        for s in spans
        if s["name"] == "tide.v1.Gateway/Pull"
        and s["attributes"].get("messaging.consumer.group.name") == "g_trace"
    ]
    entries = [
        s
        for s in spans
        if s["trace_id"] == pull["trace_id"] and s["name"] == "tide.v1.Dispatch/GetQueueEntries"
    ]
    assert entries, "no GetQueueEntries span in the pull's trace"
    assert entries[0]["attributes"]["messaging.destination.name"] == TOPIC
    assert entries[0]["attributes"]["messaging.tide.queue_id"] == 0
    assert pull["attributes"]["messaging.tide.broker_name"] == "broker-a"


def test_json_log_lines_inside_a_call_carry_its_trace_id(cluster: Cluster, spans_dir: Path) -> None:
    with pytest.raises(grpc.RpcError):
        cluster.gateway.stub.GetTopicRoute(ns_pb.GetTopicRouteRequest(topic="T_logged"), timeout=20)

    def logged() -> list[dict[str, Any]]:
        entries = []
        for line in cluster.gateway.stderr().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if "GetTopicRoute failed" in entry.get("msg", "") and "T_logged" in entry["msg"]:
                entries.append(entry)
        return entries

    wait_until(
        lambda: bool(logged()),
        "the gateway's debug line for the failed call",
        interval_s=SCRAPE_INTERVAL_S,
    )
    (entry,) = logged()
    assert len(entry["trace_id"]) == 32 and len(entry["span_id"]) == 16
    wait_until(
        lambda: any(
            s["trace_id"] == entry["trace_id"] and s["span_id"] == entry["span_id"]
            for s in read_spans(spans_dir)
        ),
        "the logged span in the gateway's span file",
        interval_s=SCRAPE_INTERVAL_S,
    )

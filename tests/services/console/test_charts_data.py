"""The live charts' data: a real gateway's Prometheus endpoint scraped and parsed, an
unreachable endpoint reported, and the text exposition's counters and histograms read."""

from __future__ import annotations

from typing import Any

from services.console.data import limits
from services.console.data.charts import parse, snapshot
from tests._cluster import Cluster
from tests._service_process import REPO_ROOT, free_port
from tide.client import Producer

CONFIG_DOC = REPO_ROOT / "docs" / "configuration.md"
EXPOSITION = """\
# TYPE tide_gateway_produced_messages_total counter
tide_gateway_produced_messages_total{topic="a"} 5.0
tide_gateway_produced_messages_total{topic="b"} 2.0
# TYPE tide_gateway_produce_latency_seconds histogram
tide_gateway_produce_latency_seconds_bucket{le="0.1"} 2.0
tide_gateway_produce_latency_seconds_bucket{le="+Inf"} 3.0
tide_gateway_produce_latency_seconds_sum 0.5
tide_gateway_produce_latency_seconds_count 3.0
# TYPE tide_gateway_held_pulls gauge
tide_gateway_held_pulls 4.0
"""


def test_parse_sums_counters_and_reads_histograms() -> None:
    counters, latencies = parse(EXPOSITION)
    assert counters == {"produced": 7.0}
    assert latencies == {"produce_latency": [0.5, 3.0]}


def test_snapshot_of_a_real_gateway_and_an_unreachable_endpoint(console_cluster: Cluster) -> None:
    with Producer(console_cluster.gateway.listen) as producer:
        console_cluster.create_topic("T_console_charts", queues=1)
        producer.send("T_console_charts", "counted")
    metrics = str(console_cluster.gateway.ready["metrics"])
    nowhere = f"127.0.0.1:{free_port()}"
    snap = snapshot([("gateway", metrics), ("gone", nowhere)])
    endpoints: list[dict[str, Any]] = snap["endpoints"]  # type: ignore[assignment]
    gateway, gone = endpoints
    assert gateway["error"] == "" and gateway["counters"]["produced"] >= 1
    latency_sum_s, latency_count = gateway["latencies"]["produce_latency"]
    assert latency_count >= 1 and latency_sum_s > 0
    assert gone["error"].startswith(f"cannot scrape http://{nowhere}/metrics")
    assert snap["series"]["produced"] == "produced messages/s (gateway)"  # type: ignore[index]


def test_every_page_limit_is_in_the_configuration_reference() -> None:
    section = CONFIG_DOC.read_text().partition("## console: the messages, dead letters")[2]
    values = {name: value for name, value in vars(limits).items() if name.isupper()}
    missing = [name for name, value in values.items() if f"| `{name}` | {value} |" not in section]
    assert values and not missing, f"docs/configuration.md lacks rows for {missing}"

"""deploy/grafana/tide-dashboard.json: valid, and every metric it queries is one the
services define (so a renamed metric cannot leave a silently empty panel)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "tide-dashboard.json"
METRIC_RE = re.compile(r"\btide_[a-z_]+\b")
SERVICES = ("storage", "dispatch", "nameserver", "gateway")


def defined_metrics() -> set[str]:
    names: set[str] = set()
    for path in [*ROOT.glob("services/**/metrics.py"), *ROOT.glob("services/**/*_metrics.py")]:
        names |= set(re.findall(r'"(tide_[a-z_]+)"', path.read_text()))
    for service in SERVICES:  # the interceptor's, one set per service
        names.add(f"tide_{service}_rpc_errors_total")
    return names


def queried_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    found: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found |= set(METRIC_RE.findall(target["expr"]))
    return {re.sub(r"_(bucket|sum|count)$", "", name) for name in found}


def test_dashboard_queries_only_defined_metrics() -> None:
    queried = queried_metrics()
    assert len(queried) >= 25
    assert queried <= defined_metrics(), queried - defined_metrics()


def test_dashboard_covers_throughput_latency_lag_disk_replication_delivery_and_ordering() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    rows = {panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"}
    assert rows >= {
        "Throughput",
        "Latency",
        "Lag",
        "Disk",
        "Replication",
        "Delivery",
        "Ordering and transactions",
    }
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))

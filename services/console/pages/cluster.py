"""Cluster: every broker member the name servers know, its role and addresses and its
storage's disk usage, writability and replication lag (all through the gateway:
GetClusterInfo with_status asks each member's storage); then the services seen at the
Prometheus endpoints the console was given (name servers, gateways...: the gateway's API
lists neither)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.console.metrics import Sample, ScrapeError, scrape
from services.console.pages._util import gateway_of
from services.console.render import NavEntry, render
from tide.v1.nameserver_pb2 import BrokerLiveInfo

NAV = NavEntry("Cluster", "/cluster")


@dataclass(frozen=True)
class Figures:
    """A member's storage figures; None: not known (its storage did not answer)."""

    disk_usage_ratio: float | None = None
    writable: bool | None = None
    replication_lag_bytes: int | None = None
    note: str = ""


@dataclass(frozen=True)
class BrokerRow:
    cluster: str
    name: str
    broker_id: int
    role: str
    storage: str
    dispatch: str
    topic_count: int
    last_seen_s: float
    figures: Figures


def figures_of(member: BrokerLiveInfo) -> Figures:
    """A slave's lag behind its master, or a master's largest lag among its slaves (none
    without a connected slave)."""
    if not member.status_known:
        return Figures(note=member.status_error or "the gateway gave no status")
    slave = member.broker_id > 0
    if member.replicas == 0:
        note = "master not connected" if slave else "no slave connected"
        return Figures(member.disk_usage_ratio, member.writable, None, note)
    return Figures(member.disk_usage_ratio, member.writable, member.replication_lag_bytes)


@dataclass(frozen=True)
class ServiceRow:
    """A --metrics-endpoint: what answers there (its OpenTelemetry service.name)."""

    name: str
    endpoint: str
    service: str
    note: str


Scraped = dict[str, list[Sample]] | ScrapeError


async def _scrape_all(endpoints: dict[str, str]) -> dict[str, Scraped]:
    async def one(endpoint: str) -> Scraped:
        try:
            return await run_in_threadpool(scrape, endpoint)
        except ScrapeError as exc:
            return exc

    results = await asyncio.gather(*(one(endpoint) for endpoint in endpoints.values()))
    return dict(zip(endpoints, results, strict=True))


def service_rows(endpoints: dict[str, str], scraped: dict[str, Scraped]) -> list[ServiceRow]:
    rows = []
    for name, endpoint in sorted(endpoints.items()):
        result = scraped[name]
        if isinstance(result, ScrapeError):
            rows.append(ServiceRow(name, endpoint, "", f"does not answer: {result}"))
            continue
        info = result.get("target_info", [])
        service = info[0].labels.get("service_name", "") if info else ""
        rows.append(ServiceRow(name, endpoint, service, "answers"))
    return rows


async def cluster_page(request: Request) -> Response:
    info = await gateway_of(request).call(request, lambda admin: admin.cluster(with_status=True))
    endpoints = dict(request.app.state.config.metrics_endpoints)
    now_ms = int(time.time() * 1000)
    members = sorted(info.brokers, key=lambda b: (b.cluster_name, b.broker_name, b.broker_id))
    scraped = await _scrape_all(endpoints)
    rows = [
        BrokerRow(
            b.cluster_name,
            b.broker_name,
            b.broker_id,
            "master" if b.broker_id == 0 else "slave",
            b.address.storage,
            b.address.dispatch,
            b.topic_count,
            round(max(0, now_ms - b.last_update_ms) / 1000, 1),
            figures_of(b),
        )
        for b in members
    ]
    clusters = {name: list(brokers.broker_names) for name, brokers in sorted(info.clusters.items())}
    return render(
        request,
        "cluster.html",
        {
            "title": "Cluster",
            "rows": rows,
            "clusters": clusters,
            "services": service_rows(endpoints, scraped),
        },
    )


ROUTES = (Route("/cluster", cluster_page),)

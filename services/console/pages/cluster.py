"""Cluster: every broker member the name servers know (through the gateway), its role and
addresses and, from its storage's Prometheus endpoint when the console was given it
(``--metrics-endpoint broker-a=HOST:PORT``, ``broker-a-1=...`` for slave 1), its disk
usage, writability and replication lag (the gateway's cluster API does not carry them);
then the services seen at the endpoints the console was given (name servers, gateways...:
the gateway's API lists neither)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.console.metrics import Sample, ScrapeError, first_value, scrape
from services.console.pages._util import gateway_of
from services.console.render import NavEntry, render

NAV = NavEntry("Cluster", "/cluster")


@dataclass(frozen=True)
class Figures:
    """A member's storage figures; None: not known (no endpoint, or its scrape failed)."""

    disk_usage_ratio: float | None = None
    writable: bool | None = None
    replication_lag_bytes: int | None = None
    note: str = "no --metrics-endpoint for this member"


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


def member_name(broker_name: str, broker_id: int) -> str:
    """The --metrics-endpoint name of a member's storage."""
    return broker_name if broker_id == 0 else f"{broker_name}-{broker_id}"


def figures_of(samples: dict[str, list[Sample]], *, slave: bool) -> Figures:
    """A slave's lag behind its master, or a master's largest lag among its slaves."""
    ratio = first_value(samples, "tide_storage_disk_usage_ratio")
    writable = first_value(samples, "tide_storage_writable")
    lags = [
        s.value
        for s in samples.get("tide_storage_replication_lag_bytes", [])
        if s.labels.get("role") == ("slave" if slave else "master")
    ]
    return Figures(
        ratio,
        None if writable is None else writable >= 1,
        int(max(lags)) if lags else None,
        "" if lags or slave else "no slave connected",
    )


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


def _figures(scraped: Scraped | None, *, slave: bool) -> Figures:
    if scraped is None:
        return Figures()
    if isinstance(scraped, ScrapeError):
        return Figures(note=f"scrape failed: {scraped}")
    return figures_of(scraped, slave=slave)


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
    info = await gateway_of(request).call(request, lambda admin: admin.cluster())
    endpoints = dict(request.app.state.config.metrics_endpoints)
    now_ms = int(time.time() * 1000)
    members = sorted(info.brokers, key=lambda b: (b.cluster_name, b.broker_name, b.broker_id))
    scraped = await _scrape_all(endpoints)
    figures = [
        _figures(scraped.get(member_name(b.broker_name, b.broker_id)), slave=b.broker_id > 0)
        for b in members
    ]
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
            member_figures,
        )
        for b, member_figures in zip(members, figures, strict=True)
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

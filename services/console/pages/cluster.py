"""Cluster: every broker member the name servers know (through the gateway), its role and
addresses; the gateway the console talks to."""

from __future__ import annotations

import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.console.pages._util import gateway_of
from services.console.render import NavEntry, render

NAV = NavEntry("Cluster", "/cluster")


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


async def cluster_page(request: Request) -> Response:
    info = await gateway_of(request).call(request, lambda admin: admin.cluster())
    now_ms = int(time.time() * 1000)
    members = sorted(info.brokers, key=lambda b: (b.cluster_name, b.broker_name, b.broker_id))
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
        )
        for b in members
    ]
    clusters = {name: list(brokers.broker_names) for name, brokers in sorted(info.clusters.items())}
    return render(request, "cluster.html", {"title": "Cluster", "rows": rows, "clusters": clusters})


ROUTES = (Route("/cluster", cluster_page),)

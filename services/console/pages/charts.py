"""Live charts: throughput and latency from the services' Prometheus endpoints
(``--metrics-endpoint NAME=HOST:PORT``). The page's script polls /charts/data.json (a
snapshot of totals) and keeps the samples in the browser."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from services.console.data.charts import COUNTERS, LATENCIES, snapshot
from services.console.render import NavEntry, render

NAV = NavEntry("Charts", "/charts")
# The browser polls this often and keeps this many samples per series (its ring).
POLL_INTERVAL_MS = 2000
RING_SAMPLES = 150


async def charts_page(request: Request) -> Response:
    endpoints = request.app.state.config.metrics_endpoints
    series = [(key, label) for key, (label, _) in (COUNTERS | LATENCIES).items()]
    return render(
        request,
        "charts.html",
        {
            "title": "Live charts",
            "endpoints": endpoints,
            "series": series,
            "poll_ms": POLL_INTERVAL_MS,
            "ring": RING_SAMPLES,
        },
    )


async def charts_data(request: Request) -> Response:
    endpoints = request.app.state.config.metrics_endpoints
    return JSONResponse(await run_in_threadpool(snapshot, endpoints))


ROUTES = (
    Route("/charts", charts_page),
    Route("/charts/data.json", charts_data),
)

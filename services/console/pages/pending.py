"""Pending: delayed and timed messages not yet due, and transactional half messages not
yet committed or rolled back, of one topic or all."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.console.data.limits import PENDING_MAX_LIST, PENDING_MAX_SCANNED
from services.console.data.pending import pending
from services.console.pages._times import utc_text
from services.console.pages._util import gateway_of
from services.console.render import NavEntry, render

NAV = NavEntry("Pending", "/pending")


async def pending_page(request: Request) -> Response:
    topic = request.query_params.get("topic", "").strip()
    found = await gateway_of(request).call(request, lambda admin: pending(admin, topic))
    return render(
        request,
        "pending.html",
        {
            "title": "Pending messages",
            "topic": topic,
            "pending": found,
            "utc": utc_text,
            "max_list": PENDING_MAX_LIST,
            "max_scanned": PENDING_MAX_SCANNED,
        },
    )


ROUTES = (Route("/pending", pending_page),)

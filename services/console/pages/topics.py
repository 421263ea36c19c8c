"""Topics: the list with message types; detail, create, update and delete come next."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.console.pages._util import gateway_of
from services.console.render import NavEntry, render

NAV = NavEntry("Topics", "/topics")


async def topics_page(request: Request) -> Response:
    types = await gateway_of(request).call(request, lambda admin: admin.topic_types())
    return render(request, "topics.html", {"title": "Topics", "topics": sorted(types.items())})


ROUTES = (Route("/topics", topics_page),)

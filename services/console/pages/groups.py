"""Consumer groups: the list (groups with a config); detail, lag and reset come next."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.console.pages._util import gateway_of
from services.console.render import NavEntry, render

NAV = NavEntry("Consumer groups", "/groups")


async def groups_page(request: Request) -> Response:
    groups = await gateway_of(request).call(request, lambda admin: admin.list_groups())
    names = [g.group_name for g in groups]
    return render(request, "groups.html", {"title": "Consumer groups", "groups": names})


ROUTES = (Route("/groups", groups_page),)

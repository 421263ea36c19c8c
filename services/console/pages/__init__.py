"""The console's pages: ONE MODULE PER PAGE, listed here in menu order.

A page module exposes:

* ``NAV``: a :class:`services.console.render.NavEntry` (label, path) for the menu, or
  None (a page reached from others, e.g. login);
* ``ROUTES``: a tuple of Starlette routes, its handlers ``async def (request) -> Response``
  answering ``render(request, "<page>.html", {"title": ..., ...})`` (templates extend
  ``base.html``), calling the gateway only through ``request.app.state.gateway``
  (services/console/gateway.py) and checking every POST with ``checked_form(request)``.

To add a page: write ``pages/<name>.py`` and its template(s), and add the module below.
"""

from __future__ import annotations

from types import ModuleType

from services.console.pages import (
    charts,
    cluster,
    dead_letters,
    groups,
    login,
    messages,
    pending,
    topics,
)

PAGES: tuple[ModuleType, ...] = (
    cluster,
    topics,
    groups,
    messages,
    dead_letters,
    pending,
    charts,
    login,
)

"""Rendering pages: the Jinja2 environment (autoescaped) and what every page gets.

The page contract (services/console/pages/__init__.py): each page module exposes ``NAV``
(a :class:`NavEntry`, or None for pages outside the menu) and ``ROUTES`` (Starlette
routes); its handlers answer ``await render(request, "x.html", {...})``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from services.console.session import CSRF_FIELD, pop_flash, session_of

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"

_environment = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
    autoescape=True,
    undefined=jinja2.StrictUndefined,  # a misspelt name fails the test, not the user
    trim_blocks=True,
    lstrip_blocks=True,
)


@dataclass(frozen=True)
class NavEntry:
    """A page in the menu: its label and path (the current page is marked by prefix)."""

    label: str
    path: str


def render(
    request: Request, template: str, context: dict[str, Any], status: int = 200
) -> HTMLResponse:
    """``template`` with ``context`` plus the menu, the flash message, the CSRF field and
    the user; never the secret key (the session's credentials are not passed)."""
    message, kind = pop_flash(request)
    session = session_of(request)
    state = request.app.state
    page = {
        "nav": state.nav,
        "path": request.url.path,
        "flash": message,
        "flash_kind": kind,
        "csrf_field": CSRF_FIELD,
        "csrf_token": session.csrf,
        "user": session.access_key,
        "auth_seen": state.auth_seen,
        "gateway": state.config.gateway,
        "denied": session.denied,
    }
    html = _environment.get_template(template).render(**page, **context)
    return HTMLResponse(html, status_code=status)

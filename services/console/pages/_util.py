"""Helpers the pages share: the gateway of a request, bounded query parameters."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request

from services.console.gateway import Gateway

# A name in a path or form (topic, group) is cut here when quoted back in a message.
MAX_QUOTED_CHARS = 80


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def quoted(text: str) -> str:
    """``text`` for a message: at most MAX_QUOTED_CHARS characters."""
    return repr(text[:MAX_QUOTED_CHARS] + ("..." if len(text) > MAX_QUOTED_CHARS else ""))


def page_rows(request: Request) -> tuple[int, int]:
    """(page number from 1, rows per page) from ``?page=&rows=``, bounded by the config."""
    config = request.app.state.config
    try:
        page = int(request.query_params.get("page", "1"))
        rows = int(request.query_params.get("rows", str(config.page_size_rows)))
    except ValueError:
        raise HTTPException(400, "page and rows must be whole numbers") from None
    if page < 1 or not 1 <= rows <= config.max_page_size_rows:
        raise HTTPException(400, f"give page 1 or more and rows 1..{config.max_page_size_rows}")
    return page, rows

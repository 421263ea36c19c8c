"""Helpers the pages share: the gateway of a request, bounded query parameters, quoting."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request

# Input quoted back in a message: the data layer's one quoting (QUOTE_MAX_CHARS).
from services.console.data.messages import quote as quoted
from services.console.gateway import Gateway

__all__ = ["gateway_of", "page_rows", "quoted"]


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


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

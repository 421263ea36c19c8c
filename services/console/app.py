"""``create_app(config)``: the console's Starlette app (pages, static files, /healthz,
sessions, error pages)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from services.console.config import ConsoleConfig
from services.console.data.resend import ResendJobs
from services.console.gateway import Gateway, GatewayError, LoginRequired
from services.console.pages import PAGES
from services.console.render import render
from services.console.session import SessionCodec, load_key, new_session

STATIC_DIR = Path(__file__).resolve().parent / "static"
# Every page: no framing, no inline script, nothing from another origin.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
MAX_ERROR_DETAIL_CHARS = 300


class _Sessions(BaseHTTPMiddleware):
    """Loads the session cookie into ``request.state.session`` (a fresh one when absent),
    writes it back when a handler changed it, and adds the security headers."""

    def __init__(self, app: Callable[..., object], codec: SessionCodec) -> None:
        super().__init__(app)  # type: ignore[arg-type]
        self._codec = codec

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        loaded = self._codec.read(request)
        request.state.session = loaded or new_session()
        response = await call_next(request)
        if request.state.session != loaded:
            self._codec.write(response, request.state.session)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response


async def _healthz(request: Request) -> Response:
    """Liveness and readiness: the process serves (the gateway is not asked: a console
    whose gateway is down still shows pages saying so)."""
    return PlainTextResponse("ok\n")


async def _home(request: Request) -> Response:
    return RedirectResponse("/cluster", status_code=303)


async def _login_required(request: Request, exc: Exception) -> Response:
    request.app.state.auth_seen = True
    target = quote(request.url.path, safe="/")
    return RedirectResponse(f"/login?next={target}", status_code=303)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return render(
        request, "error.html", {"title": "Gateway error", "message": exc.message}, exc.status
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    title = {403: "Forbidden", 404: "Not found", 405: "Method not allowed"}.get(
        exc.status_code, "Bad request"
    )
    detail = str(exc.detail)[:MAX_ERROR_DETAIL_CHARS]
    return render(request, "error.html", {"title": title, "message": detail}, exc.status_code)


def create_app(config: ConsoleConfig, *, on_ready: Callable[[], None] | None = None) -> Starlette:
    """The console for ``config``; ``on_ready`` is called once it serves (the ready file)."""
    gateway = Gateway(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            gateway.close()

    routes: list[BaseRoute] = [
        Route("/", _home),
        Route("/healthz", _healthz),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    for page in PAGES:
        routes += page.ROUTES
    codec = SessionCodec(load_key(config), config)
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_Sessions, codec=codec)],
        exception_handlers={
            LoginRequired: _login_required,
            GatewayError: _gateway_error,
            HTTPException: _http_error,
        },
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.gateway = gateway
    app.state.resend_jobs = ResendJobs()  # the dead-letters page's background resends
    app.state.nav = [page.NAV for page in PAGES if page.NAV is not None]
    app.state.auth_seen = False
    return app

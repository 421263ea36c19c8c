"""Login / logout, for a gateway with authentication on (--auth-enabled).

The access key and secret key are checked by one signed gateway call (ListTopics): the
gateway answers UNAUTHENTICATED for an unknown user or a wrong key. A user the gateway
knows but whose ACL denies ListTopics (PERMISSION_DENIED) is logged in all the same: the
pages show each denial. The pair lives only in the encrypted session cookie.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from services.console.gateway import GatewayError, LoginRequired
from services.console.pages._util import gateway_of
from services.console.render import render
from services.console.session import Session, checked_form, flash, new_session, set_session
from tide.client import PermissionDenied

NAV = None
MAX_KEY_CHARS = 256  # an access key or secret key longer than this is refused
MAX_NEXT_CHARS = 512
_LOCAL_PATH = re.compile(r"/[A-Za-z0-9/_%.~=&?-]*")


def next_path(value: object) -> str:
    """Where to go after login: a path of this site only. Never another site: not
    ``//host``, nor ``/\\host`` (browsers read a backslash as a slash), nor anything with a
    scheme, a space or a control character."""
    text = value if isinstance(value, str) else ""
    if not _LOCAL_PATH.fullmatch(text) or text.startswith("//") or len(text) > MAX_NEXT_CHARS:
        return "/cluster"
    return text


async def login_form(request: Request) -> Response:
    return render(
        request,
        "login.html",
        {
            "title": "Log in",
            "errors": {},
            "access_key": "",
            "next": next_path(request.query_params.get("next")),
        },
    )


async def login(request: Request) -> Response:
    form = await checked_form(request)
    access_key = str(form.get("access_key", "")).strip()
    secret_key = str(form.get("secret_key", ""))
    target = next_path(form.get("next"))
    errors: dict[str, str] = {}
    if not access_key or len(access_key) > MAX_KEY_CHARS:
        errors["access_key"] = f"Give your access key (1..{MAX_KEY_CHARS} characters)."
    if not secret_key or len(secret_key) > MAX_KEY_CHARS:
        errors["secret_key"] = f"Give your secret key (1..{MAX_KEY_CHARS} characters)."
    if not errors:
        candidate = Session(new_session().csrf, access_key, secret_key)
        set_session(request, candidate)
        try:
            await gateway_of(request).call(request, lambda admin: admin.list_topics())
        except GatewayError as exc:
            if not isinstance(exc.error, PermissionDenied):
                errors["secret_key"] = "The gateway refused this access key and secret key."
        except LoginRequired:
            errors["secret_key"] = "The gateway refused this access key and secret key."
    if errors:
        set_session(request, new_session())
        return render(
            request,
            "login.html",
            {
                "title": "Log in",
                "errors": errors,
                "access_key": access_key[:MAX_KEY_CHARS],
                "next": target,
            },
            400,
        )
    request.app.state.auth_seen = True
    flash(request, f"Signed in as {access_key}.")
    return RedirectResponse(target, status_code=303)


async def logout(request: Request) -> Response:
    await checked_form(request)
    set_session(request, new_session())
    flash(request, "Signed out.")
    return RedirectResponse("/login", status_code=303)


ROUTES = (
    Route("/login", login_form, methods=["GET"]),
    Route("/login", login, methods=["POST"]),
    Route("/logout", logout, methods=["POST"]),
)

"""Sessions in a cookie: Fernet-encrypted and signed JSON (the console keeps no state).

A session holds a CSRF token (every POST form carries it), the logged-in user's access
key and secret key (only when the gateway has authentication on) and one flash message.
The cookie is HttpOnly, SameSite=Strict, Secure under HTTPS; Fernet's ttl ends a login
``session_max_age_s`` after it was made. The secret key is never rendered into a page:
only the encrypted cookie carries it, back to this process.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from services.console.config import ConsoleConfig
from tide.auth.client import Credentials

COOKIE_NAME = "tide_console"
CSRF_FIELD = "csrf_token"
CSRF_TOKEN_BYTES = 32
# The flash message's bound (an error quoting input is cut there).
MAX_FLASH_CHARS = 500
# A cookie over 4096 bytes is dropped by browsers; a session is far below.
MAX_COOKIE_BYTES = 4096
# Actions the gateway denied this login (their forms are hidden); a short list.
MAX_DENIED_ACTIONS = 16

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Session:
    csrf: str
    access_key: str = ""
    secret_key: str = field(default="", repr=False)
    flash: str = ""
    flash_kind: str = "info"  # info | error
    # Actions (the pages' names: "topic-change", "offset-reset") the gateway refused this
    # login with PERMISSION_DENIED: their forms are hidden until the next login.
    denied: tuple[str, ...] = ()

    @property
    def credentials(self) -> Credentials | None:
        if not self.access_key:
            return None
        return Credentials(self.access_key, self.secret_key)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "c": self.csrf,
                "a": self.access_key,
                "s": self.secret_key,
                "f": self.flash,
                "k": self.flash_kind,
                "d": list(self.denied),
            }
        ).encode()

    @staticmethod
    def from_json(data: bytes) -> Session:
        doc: dict[str, Any] = json.loads(data)
        denied = tuple(str(action) for action in doc.get("d", ()))[:MAX_DENIED_ACTIONS]
        return Session(
            str(doc["c"]), str(doc["a"]), str(doc["s"]), str(doc["f"]), str(doc["k"]), denied
        )


def new_session() -> Session:
    return Session(csrf=secrets.token_urlsafe(CSRF_TOKEN_BYTES))


def load_key(config: ConsoleConfig) -> bytes:
    """The Fernet key of ``--session-key-file``, or a random one (restarts log users out)."""
    if config.session_key_file is None:
        _log.warning("no --session-key-file: a random session key (a restart logs users out)")
        return Fernet.generate_key()
    key = Path(config.session_key_file).read_bytes().strip()
    try:
        Fernet(key)
    except ValueError:
        raise ValueError(
            f"--session-key-file {config.session_key_file}: not a Fernet key (32 url-safe "
            "base64-encoded bytes; make one with: python -c 'from cryptography.fernet import "
            "Fernet; print(Fernet.generate_key().decode())')"
        ) from None
    return key


class SessionCodec:
    """Reads and writes the session cookie."""

    def __init__(self, key: bytes, config: ConsoleConfig) -> None:
        self._fernet = Fernet(key)
        self._max_age_s = config.session_max_age_s
        self._secure = config.https

    def read(self, request: Request) -> Session | None:
        token = request.cookies.get(COOKIE_NAME)
        if not token or len(token) > MAX_COOKIE_BYTES:
            return None
        try:
            return Session.from_json(self._fernet.decrypt(token.encode(), ttl=self._max_age_s))
        except (InvalidToken, ValueError, KeyError, TypeError):
            return None  # expired, tampered with, or from another key: a fresh session

    def write(self, response: Response, session: Session) -> None:
        response.set_cookie(
            COOKIE_NAME,
            self._fernet.encrypt(session.to_json()).decode(),
            max_age=self._max_age_s,
            path="/",
            secure=self._secure,
            httponly=True,
            samesite="strict",
        )


def session_of(request: Request) -> Session:
    """The request's session (the middleware put it there)."""
    session: Session = request.state.session
    return session


def set_session(request: Request, session: Session) -> None:
    """Replace the request's session; the middleware writes the cookie."""
    request.state.session = session


def flash(request: Request, message: str, kind: str = "info") -> None:
    """A message for the next page shown (after a redirect)."""
    set_session(
        request, replace(session_of(request), flash=message[:MAX_FLASH_CHARS], flash_kind=kind)
    )


def remember_denied(request: Request, action: str) -> None:
    """The gateway refused ``action`` to this login: hide its forms from now on."""
    session = session_of(request)
    if action not in session.denied:
        denied = (*session.denied, action)[-MAX_DENIED_ACTIONS:]
        set_session(request, replace(session, denied=denied))


def pop_flash(request: Request) -> tuple[str, str]:
    session = session_of(request)
    if not session.flash:
        return "", "info"
    set_session(request, replace(session, flash="", flash_kind="info"))
    return session.flash, session.flash_kind


async def checked_form(request: Request) -> FormData:
    """The POSTed form, once its CSRF token matches the session's (else 403)."""
    form = await request.form()
    token = form.get(CSRF_FIELD)
    if not isinstance(token, str) or not hmac.compare_digest(token, session_of(request).csrf):
        raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page")
    return form

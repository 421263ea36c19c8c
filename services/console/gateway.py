"""The one place that makes tide.client objects, from the session's credentials, and runs
their (blocking) calls in Starlette's threadpool; a client error becomes a page message.

Clients are kept open per user (one gRPC channel each, up to MAX_CACHED_CLIENTS, the least
recently used closed first): a page load is a few calls, and a channel per request would
pay the connection set-up (and TLS handshake) each time.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from services.console.config import MAX_CACHED_CLIENTS, ConsoleConfig
from services.console.session import remember_denied, session_of
from tide.client import (
    Admin,
    Credentials,
    PermissionDenied,
    Producer,
    TideError,
    Unauthenticated,
    Unavailable,
)

T = TypeVar("T")
# A gateway message quoted on a page is cut here (it may quote input).
MAX_ERROR_CHARS = 400


class LoginRequired(Exception):
    """The gateway wants signed calls and the session has no user: go to /login."""


class GatewayError(Exception):
    """A call failed; ``message`` is what the page shows, ``status`` its HTTP status."""

    def __init__(self, message: str, status: int, error: TideError) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error = error


def page_message(error: TideError, gateway: str) -> tuple[str, int]:
    """What a page says about a failed call, and its HTTP status."""
    text = str(error)[:MAX_ERROR_CHARS]
    if isinstance(error, PermissionDenied):
        return f"Permission denied by the gateway: your user may not do this. ({text})", 403
    if isinstance(error, Unauthenticated):
        return f"The gateway did not accept your login: log in again. ({text})", 401
    if isinstance(error, Unavailable):
        return f"The gateway at {gateway} is unreachable: is it running? ({text})", 503
    if error.code is None or error.code.name in (
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "FAILED_PRECONDITION",
        "ALREADY_EXISTS",
    ):
        return text, 400 if error.code is None or error.code.name != "NOT_FOUND" else 404
    return text, 502


class Gateway:
    """tide.client objects per user, over the console's one gateway address."""

    def __init__(self, config: ConsoleConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._admins: OrderedDict[str, Admin] = OrderedDict()

    @property
    def address(self) -> str:
        return self._config.gateway

    def admin(self, credentials: Credentials | None) -> Admin:
        """The user's Admin (opened once, kept while recently used)."""
        key = _client_key(credentials)
        with self._lock:
            admin = self._admins.pop(key, None)
            if admin is None:
                admin = Admin(
                    self._config.gateway,
                    rpc_timeout_ms=self._config.rpc_timeout_ms,
                    tls=self._config.gateway_tls_files(),
                    credentials=credentials,
                )
            self._admins[key] = admin
            while len(self._admins) > MAX_CACHED_CLIENTS:
                _, oldest = self._admins.popitem(last=False)
                oldest.close()
            return admin

    def open_admin(self, credentials: Credentials | None) -> Admin:
        """A new Admin of the user for a background job (the job closes it)."""
        return Admin(
            self._config.gateway,
            rpc_timeout_ms=self._config.rpc_timeout_ms,
            tls=self._config.gateway_tls_files(),
            credentials=credentials,
        )

    def open_producer(self, credentials: Credentials | None) -> Producer:
        """A new Producer of the user for a background job (the job closes it)."""
        return Producer(
            self._config.gateway,
            rpc_timeout_ms=self._config.rpc_timeout_ms,
            tls=self._config.gateway_tls_files(),
            credentials=credentials,
        )

    async def call(self, request: Request, work: Callable[[Admin], T]) -> T:
        """``work(admin)`` in the threadpool as the session's user; a TideError becomes
        :class:`GatewayError` (or :class:`LoginRequired`)."""
        credentials = session_of(request).credentials
        admin = self.admin(credentials)
        return await self.run(request, lambda: work(admin))

    async def change(self, request: Request, action: str, work: Callable[[Admin], T]) -> T:
        """:meth:`call` for a change the pages name ``action`` ("topic-change"): when the
        gateway denies it, the session remembers, and the pages hide its forms."""
        try:
            return await self.call(request, work)
        except GatewayError as exc:
            if isinstance(exc.error, PermissionDenied):
                remember_denied(request, action)
            raise

    async def run(self, request: Request, work: Callable[[], T]) -> T:
        """``work()`` in the threadpool, its TideError mapped as :meth:`call` does."""
        try:
            return await run_in_threadpool(work)
        except Unauthenticated as exc:
            if session_of(request).credentials is None:
                raise LoginRequired() from exc
            message, status = page_message(exc, self.address)
            raise GatewayError(message, status, exc) from exc
        except TideError as exc:
            message, status = page_message(exc, self.address)
            raise GatewayError(message, status, exc) from exc

    def close(self) -> None:
        with self._lock:
            for admin in self._admins.values():
                admin.close()
            self._admins.clear()


def _client_key(credentials: Credentials | None) -> str:
    """A cache key that holds no secret in clear (a digest of the pair)."""
    if credentials is None:
        return ""
    pair = f"{credentials.access_key}\0{credentials.secret_key}".encode()
    return hashlib.sha256(pair).hexdigest()

"""Who the caller is and what they may do: the users and policies the gateway holds
(refreshed from the storages, cache.py), the signature check and the ACL decision."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from services.gateway.auth.actions import Need
from tide.auth.model import Denial, PolicyEntry, User, decide
from tide.auth.signature import (
    AUTHORIZATION_KEY,
    DATE_TIME_KEY,
    AuthenticationError,
    date_time_s,
    parse_signed,
    verify,
)

DEFAULT_MAX_SKEW_S = 900.0
# Signatures verified and kept (authorization + date-time -> the user it verified against):
# a client stamps many calls with the same second, so most calls skip the parse and the
# HMAC. Cleared when full; a hit is used only for the very same user object (a refresh
# that changed a secret key, or disabled the user, makes new objects) and within the skew.
VERIFIED_CACHE_MAX_COUNT = 4096


@dataclass(frozen=True)
class AuthState:
    """One consistent view of the users and their policies."""

    users: Mapping[str, User] = field(default_factory=dict)
    policies: Mapping[str, tuple[PolicyEntry, ...]] = field(default_factory=dict)


class Authority:
    def __init__(self, max_skew_s: float = DEFAULT_MAX_SKEW_S) -> None:
        self.max_skew_s = max_skew_s
        self.state = AuthState()
        self._verified: dict[tuple[str, str], tuple[User, str]] = {}

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> User:
        """The signing user; AuthenticationError (no secret in it) otherwise."""
        metadata = tuple(metadata)
        key = _signature_key(metadata)
        hit = self._verified.get(key) if key is not None else None
        if hit is not None:
            user, date_time = hit
            current = self.state.users.get(user.access_key) is user and user.enabled
            if current and abs(time.time() - date_time_s(date_time)) <= self.max_skew_s:
                return user
        user = self._verify(metadata)
        if key is not None:
            if len(self._verified) >= VERIFIED_CACHE_MAX_COUNT:
                self._verified.clear()
            self._verified[key] = (user, key[1])
        return user

    def _verify(self, metadata: Iterable[tuple[str, str | bytes]]) -> User:
        signed = parse_signed(metadata)
        user = self.state.users.get(signed.access_key)
        if user is None:
            raise AuthenticationError(f"unknown access key {signed.access_key!r}")
        if not user.enabled:
            raise AuthenticationError(f"user {signed.access_key!r} is disabled")
        verify(signed, user.secret_key, self.max_skew_s, time.time())
        return user

    def authorize(self, user: User, needs: Iterable[Need], source_ip: str) -> Denial | None:
        return decide(user, self.state.policies.get(user.access_key, ()), needs, source_ip)


def _signature_key(metadata: Iterable[tuple[str, str | bytes]]) -> tuple[str, str] | None:
    """(authorization, x-mq-date-time) as sent, None when either is missing."""
    authorization = date_time = None
    for name, value in metadata:
        if name == AUTHORIZATION_KEY and isinstance(value, str):
            authorization = value
        elif name == DATE_TIME_KEY and isinstance(value, str):
            date_time = value
    if authorization is None or date_time is None:
        return None
    return authorization, date_time

"""Who the caller is and what they may do: the users and policies the gateway holds
(refreshed from the storages, cache.py), the signature check and the ACL decision."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from services.gateway.auth.actions import Need
from tide.auth.model import Denial, PolicyEntry, User, decide
from tide.auth.signature import AuthenticationError, parse_signed, verify

DEFAULT_MAX_SKEW_S = 900.0


@dataclass(frozen=True)
class AuthState:
    """One consistent view of the users and their policies."""

    users: Mapping[str, User] = field(default_factory=dict)
    policies: Mapping[str, tuple[PolicyEntry, ...]] = field(default_factory=dict)


class Authority:
    def __init__(self, max_skew_s: float = DEFAULT_MAX_SKEW_S) -> None:
        self.max_skew_s = max_skew_s
        self.state = AuthState()

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> User:
        """The signing user; AuthenticationError (no secret in it) otherwise."""
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

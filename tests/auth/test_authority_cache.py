"""The gateway's verified-signature cache (services/gateway/auth/authority.py): a hit is
the same user, still enabled, still within the skew; a changed secret key or a disabled
user is checked afresh."""

from __future__ import annotations

import time

import pytest

from services.gateway.auth.authority import Authority, AuthState
from tide.auth.model import User
from tide.auth.signature import AuthenticationError, signed_metadata

ALICE = User("alice", "alices-secret-key-0123")


def _authority(*users: User) -> Authority:
    authority = Authority(max_skew_s=60)
    authority.state = AuthState({user.access_key: user for user in users}, {})
    return authority


def test_a_repeated_signature_is_the_same_user() -> None:
    authority = _authority(ALICE)
    metadata = signed_metadata(ALICE.access_key, ALICE.secret_key)
    assert authority.authenticate(metadata) is ALICE
    assert authority.authenticate(metadata) is ALICE  # from the cache


def test_a_changed_secret_or_a_disabled_user_is_checked_afresh() -> None:
    authority = _authority(ALICE)
    metadata = signed_metadata(ALICE.access_key, ALICE.secret_key)
    authority.authenticate(metadata)
    authority.state = AuthState({"alice": User("alice", "a-new-secret-key-0123")}, {})
    with pytest.raises(AuthenticationError, match="does not match"):
        authority.authenticate(metadata)
    authority.state = AuthState({"alice": User("alice", ALICE.secret_key, enabled=False)}, {})
    with pytest.raises(AuthenticationError, match="disabled"):
        authority.authenticate(metadata)


def test_a_cached_signature_expires_with_the_skew() -> None:
    authority = _authority(ALICE)
    stamped = time.time() - 30
    metadata = signed_metadata(ALICE.access_key, ALICE.secret_key, stamped)
    assert authority.authenticate(metadata) is ALICE
    authority.max_skew_s = 10  # as if 30 s had passed beyond a 10 s skew
    with pytest.raises(AuthenticationError, match="from the server's clock"):
        authority.authenticate(metadata)

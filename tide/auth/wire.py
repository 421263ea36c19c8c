"""Users and ACLs between their model (tide.auth.model) and the wire (tide.v1 AuthUser,
AuthAcl), for the storage, the gateway and the CLI."""

from __future__ import annotations

from tide.auth.model import PolicyEntry, User
from tide.format._auth_files import entry_doc, entry_of, user_of
from tide.v1 import storage_pb2 as pb


def user_from_pb(user: pb.AuthUser) -> User:
    """A checked user (AuthFileError, a ValueError, naming what is wrong)."""
    return user_of(user.access_key, user.secret_key, user.user_type or "Normal", user.disabled)


def user_to_pb(user: User, *, with_secret: bool) -> pb.AuthUser:
    return pb.AuthUser(
        access_key=user.access_key,
        secret_key=user.secret_key if with_secret else "",
        user_type=user.user_type.value,
        disabled=not user.enabled,
    )


def entries_from_pb(acl: pb.AuthAcl) -> tuple[PolicyEntry, ...]:
    return tuple(
        entry_of(e.resource, list(e.actions), e.decision or "Allow", list(e.source_ips))
        for e in acl.entries
    )


def acl_to_pb(access_key: str, entries: tuple[PolicyEntry, ...]) -> pb.AuthAcl:
    docs = [entry_doc(e) for e in entries]
    return pb.AuthAcl(
        access_key=access_key,
        entries=[
            pb.AuthPolicyEntry(
                resource=str(d["resource"]),
                actions=list(d["actions"]),  # type: ignore[call-overload]
                decision=str(d["decision"]),
                source_ips=list(d["sourceIps"]),  # type: ignore[call-overload]
            )
            for d in docs
        ],
    )

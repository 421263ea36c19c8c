"""Users and ACL 2.0 policies through a gateway (``Admin``'s user and ACL methods;
docs/security.md). A policy entry is written as ``(resource, actions, decision,
source ranges)``: ``("Topic:orders-*", ["Pub", "Sub"], "Allow", ["10.0.0.0/8"])``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from tide.client._rpc import Connection
from tide.v1 import gateway_pb2, storage_pb2


class PolicyEntry(NamedTuple):
    resource: str
    actions: Sequence[str]
    decision: str = "Allow"
    source_ips: Sequence[str] = ()


class UserInfo(NamedTuple):
    access_key: str
    user_type: str
    enabled: bool


def _acl(access_key: str, entries: Sequence[PolicyEntry]) -> storage_pb2.AuthAcl:
    return storage_pb2.AuthAcl(
        access_key=access_key,
        entries=[
            storage_pb2.AuthPolicyEntry(
                resource=e.resource,
                actions=list(e.actions),
                decision=e.decision,
                source_ips=list(e.source_ips),
            )
            for e in entries
        ],
    )


class AuthAdmin:
    """Mixed into Admin: ``_connection`` is its connection."""

    _connection: Connection

    def create_user(self, access_key: str, secret_key: str, user_type: str = "Normal") -> None:
        self._user("CreateUser", access_key, secret_key, user_type, enabled=True)

    def update_user(
        self, access_key: str, secret_key: str, user_type: str = "Normal", *, enabled: bool = True
    ) -> None:
        """Replace the user's secret key, type and status."""
        self._user("UpdateUser", access_key, secret_key, user_type, enabled=enabled)

    def delete_user(self, access_key: str) -> None:
        """The user and its ACL."""
        self._user("DeleteUser", access_key, "", "", enabled=True)

    def _user(self, rpc: str, access_key: str, secret: str, kind: str, *, enabled: bool) -> None:
        user = storage_pb2.AuthUser(
            access_key=access_key, secret_key=secret, user_type=kind, disabled=not enabled
        )
        method = getattr(self._connection.stub, rpc)
        self._connection.call(method, gateway_pb2.UserRequest(user=user), f"{rpc} {access_key!r}")

    def list_users(self) -> list[UserInfo]:
        answer = self._connection.call(
            self._connection.stub.ListUsers, gateway_pb2.ListUsersRequest(), "ListUsers"
        )
        return [UserInfo(u.access_key, u.user_type, not u.disabled) for u in answer.users]

    def create_acl(self, access_key: str, entries: Sequence[PolicyEntry]) -> None:
        self._acl_change("CreateAcl", access_key, entries)

    def update_acl(self, access_key: str, entries: Sequence[PolicyEntry]) -> None:
        """Entries on the same resources are replaced; the others are added."""
        self._acl_change("UpdateAcl", access_key, entries)

    def delete_acl(self, access_key: str, resources: Sequence[str] = ()) -> None:
        """The entries on these resources; the whole ACL when none is given."""
        entries = [PolicyEntry(r, ["All"]) for r in resources]
        self._acl_change("DeleteAcl", access_key, entries)

    def _acl_change(self, rpc: str, access_key: str, entries: Sequence[PolicyEntry]) -> None:
        method = getattr(self._connection.stub, rpc)
        request = gateway_pb2.AclRequest(acl=_acl(access_key, entries))
        self._connection.call(method, request, f"{rpc} {access_key!r}")

    def list_acls(self, access_key: str = "") -> dict[str, list[PolicyEntry]]:
        answer = self._connection.call(
            self._connection.stub.ListAcls,
            gateway_pb2.ListAclsRequest(access_key=access_key),
            "ListAcls",
        )
        return {
            acl.access_key: [
                PolicyEntry(e.resource, list(e.actions), e.decision, list(e.source_ips))
                for e in acl.entries
            ]
            for acl in answer.acls
        }

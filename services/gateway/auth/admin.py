"""Users and ACLs through the gateway (``tide user`` / ``tide acl``): each change goes to
every master broker's storage, as CreateGroup does (groups.py), and is audited; reads ask
the first master (every master holds the same users and ACLs)."""

from __future__ import annotations

import contextvars

import grpc

from services.gateway.auth.audit import Audit
from services.gateway.groups import GroupAdmin
from tide.server import ServiceError
from tide.server._peer import peer_address
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

# The access key of the call being served (set by the auth interceptor; "" with auth off).
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("tide_auth_caller", default="")
Context = grpc.aio.ServicerContext[object, object]


class AuthAdmin:
    def __init__(self, groups: GroupAdmin, audit: Audit) -> None:
        self._fanout = groups  # on_masters: every master at once, failures named
        self._audit = audit

    async def change(
        self, operation: str, user: storage_pb.AuthUser, acl: storage_pb.AuthAcl, context: Context
    ) -> storage_pb.ChangeAuthResponse:
        access_key = user.access_key or acl.access_key
        if not access_key:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "access_key: required")
        request = storage_pb.ChangeAuthRequest(operation=operation, user=user, acl=acl)
        await self._fanout.on_masters(
            "ChangeAuth", lambda stub, t: stub.ChangeAuth(request, timeout=t)
        )
        resource = f"User:{access_key}"
        self._audit.changed(CALLER.get(), operation, resource, peer_address(context.peer()))
        return storage_pb.ChangeAuthResponse()

    async def state(self) -> storage_pb.GetAuthResponse:
        """The users and ACLs of the first master (every master holds the same)."""
        request = storage_pb.GetAuthRequest()
        answers = await self._fanout.on_masters(
            "GetAuth", lambda stub, t: stub.GetAuth(request, timeout=t), first_only=True
        )
        return answers[0]


class AuthAdminRpcs:
    """The Gateway's user and ACL RPCs (a base of GatewayServicer)."""

    _auth_admin: AuthAdmin

    async def CreateUser(
        self, request: pb.UserRequest, context: Context
    ) -> storage_pb.ChangeAuthResponse:
        return await self._auth_admin.change("create_user", request.user, _NO_ACL, context)

    async def UpdateUser(
        self, request: pb.UserRequest, context: Context
    ) -> storage_pb.ChangeAuthResponse:
        return await self._auth_admin.change("update_user", request.user, _NO_ACL, context)

    async def DeleteUser(
        self, request: pb.UserRequest, context: Context
    ) -> storage_pb.ChangeAuthResponse:
        return await self._auth_admin.change("delete_user", request.user, _NO_ACL, context)

    async def ListUsers(
        self, request: pb.ListUsersRequest, context: Context
    ) -> pb.ListUsersResponse:
        state = await self._auth_admin.state()
        users = []
        for user in state.users:
            shown = storage_pb.AuthUser()
            shown.CopyFrom(user)
            shown.secret_key = ""  # never leaves the cluster
            users.append(shown)
        return pb.ListUsersResponse(users=sorted(users, key=lambda u: u.access_key))

    async def CreateAcl(
        self, request: pb.AclRequest, context: Context
    ) -> storage_pb.ChangeAuthResponse:
        return await self._auth_admin.change("create_acl", _NO_USER, request.acl, context)

    async def UpdateAcl(
        self, request: pb.AclRequest, context: Context
    ) -> storage_pb.ChangeAuthResponse:
        return await self._auth_admin.change("update_acl", _NO_USER, request.acl, context)

    async def DeleteAcl(
        self, request: pb.AclRequest, context: Context
    ) -> storage_pb.ChangeAuthResponse:
        return await self._auth_admin.change("delete_acl", _NO_USER, request.acl, context)

    async def ListAcls(self, request: pb.ListAclsRequest, context: Context) -> pb.ListAclsResponse:
        state = await self._auth_admin.state()
        acls = [
            a for a in state.acls if not request.access_key or a.access_key == request.access_key
        ]
        return pb.ListAclsResponse(acls=sorted(acls, key=lambda a: a.access_key))


_NO_ACL = storage_pb.AuthAcl()
_NO_USER = storage_pb.AuthUser()

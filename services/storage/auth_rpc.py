"""Storage GetAuth / ChangeAuth (acl, issue 22) over engine/auth_table.py."""

from __future__ import annotations

import json
from pathlib import Path

import grpc

from services.storage.engine.auth_table import AuthChangeError, AuthTable
from tide.auth.wire import acl_to_pb, entries_from_pb, user_from_pb, user_to_pb
from tide.format._auth_files import AuthFileError, user_of
from tide.server import ServiceError
from tide.v1 import storage_pb2 as pb

_CODES = {
    "exists": grpc.StatusCode.ALREADY_EXISTS,
    "missing": grpc.StatusCode.NOT_FOUND,
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
}
OPERATIONS = (
    "create_user",
    "update_user",
    "delete_user",
    "create_acl",
    "update_acl",
    "delete_acl",
)


def get_auth(table: AuthTable) -> pb.GetAuthResponse:
    users = table.users
    acls = table.acls
    return pb.GetAuthResponse(
        users=[user_to_pb(u, with_secret=True) for u in users.values()],
        acls=[acl_to_pb(key, entries) for key, entries in acls.items()],
    )


def change_auth(table: AuthTable, request: pb.ChangeAuthRequest) -> None:
    """Apply the change; ServiceError naming what to fix."""
    operation = request.operation
    try:
        if operation == "create_user":
            table.create_user(user_from_pb(request.user))
        elif operation == "update_user":
            table.update_user(user_from_pb(_keeping_secret(table, request.user)))
        elif operation == "delete_user":
            table.delete_user(request.user.access_key)
        elif operation in ("create_acl", "update_acl", "delete_acl"):
            entries = entries_from_pb(request.acl)
            change = getattr(table, operation)
            change(request.acl.access_key, entries)
        else:
            raise AuthChangeError(
                "invalid", f"operation {operation!r}: expected one of {', '.join(OPERATIONS)}"
            )
    except AuthFileError as exc:
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
    except AuthChangeError as exc:
        raise ServiceError(_CODES[exc.kind], exc.message) from None


def init_user(table: AuthTable, path: Path) -> bool:
    """Create the super user of ``path`` (``{"username", "password"}``) when there is no
    user yet; True when created. ValueError naming the file when it is malformed."""
    if table.users:
        return False
    try:
        doc = json.loads(path.read_text())
        user = user_of(str(doc["username"]), str(doc["password"]), "Super", False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        what = type(exc).__name__ if isinstance(exc, KeyError | TypeError) else str(exc)
        raise ValueError(f"--auth-init-user-file {path}: {what}") from None
    table.create_user(user)
    return True


def _keeping_secret(table: AuthTable, user: pb.AuthUser) -> pb.AuthUser:
    """An update without a secret key keeps the user's (``tide user update --disable``)."""
    existing = table.users.get(user.access_key)
    if user.secret_key or existing is None:
        return user
    kept = pb.AuthUser()
    kept.CopyFrom(user)
    kept.secret_key = existing.secret_key
    return kept

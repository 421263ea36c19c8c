"""``config/users.json`` and ``config/acl.json``: the users and ACL 2.0 policies a storage
keeps (docs/formats.md), in RocketMQ's ACL 2.0 vocabulary.

users.json::

    {"users": [{"username": "alice", "password": "<secret key>",
                "userType": "Normal", "userStatus": "enable"}]}

acl.json::

    {"acls": [{"subject": "User:alice",
               "policies": [{"resource": "Topic:orders", "actions": ["Pub"],
                             "decision": "Allow", "sourceIps": ["10.0.0.0/8"]}]}]}

The secret key must be stored as is: the gateway recomputes each request's HMAC with it.
The files are written with mode 0600 (the storage's user only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tide.auth.model import (
    Decision,
    PolicyEntry,
    User,
    UserType,
    parse_action,
    parse_network,
    parse_resource_pattern,
)

USERS_FILE = "users.json"
ACL_FILE = "acl.json"
# Most users, and policy entries per user, a storage keeps (each one limit; docs).
USERS_MAX = 10_000
POLICY_ENTRIES_MAX = 1_000
_SUBJECT_PREFIX = "User:"


class AuthFileError(ValueError):
    """A users.json / acl.json document (or a change) that is not what it must be."""


@dataclass(frozen=True)
class UserAcl:
    access_key: str
    entries: tuple[PolicyEntry, ...]


def encode_users(users: list[User]) -> bytes:
    return _dump({"users": [_user_doc(u) for u in users]})


def _user_doc(user: User) -> dict[str, str]:
    return {
        "username": user.access_key,
        "password": user.secret_key,
        "userType": user.user_type.value,
        "userStatus": "enable" if user.enabled else "disable",
    }


def decode_users(document: object) -> list[User]:
    items = _list_of(document, "users", USERS_MAX)
    users = []
    for item in items:
        if not isinstance(item, dict):
            raise AuthFileError("users.json: each user must be an object")
        users.append(
            user_of(
                str(item.get("username", "")),
                str(item.get("password", "")),
                str(item.get("userType", "Normal")),
                item.get("userStatus", "enable") == "disable",
            )
        )
    return users


def user_of(access_key: str, secret_key: str, user_type: str, disabled: bool) -> User:
    """A checked user; AuthFileError naming what is wrong (never the secret)."""
    if not access_key or len(access_key) > 128 or not access_key.isprintable():
        raise AuthFileError("access key: 1..128 printable characters")
    if " " in access_key or "," in access_key or "/" in access_key:
        raise AuthFileError("access key: no spaces, commas or slashes")
    if not 8 <= len(secret_key) <= 256:
        raise AuthFileError(f"user {access_key!r}: the secret key must be 8..256 characters")
    types = {t.value.lower(): t for t in UserType}
    if user_type.lower() not in types:
        raise AuthFileError(f"user {access_key!r}: user type must be Super or Normal")
    return User(access_key, secret_key, types[user_type.lower()], not disabled)


def encode_acls(acls: list[UserAcl]) -> bytes:
    return _dump(
        {
            "acls": [
                {
                    "subject": _SUBJECT_PREFIX + acl.access_key,
                    "policies": [entry_doc(e) for e in acl.entries],
                }
                for acl in acls
            ]
        }
    )


def entry_doc(entry: PolicyEntry) -> dict[str, object]:
    return {
        "resource": str(entry.resource),
        "actions": sorted(a.value for a in entry.actions),
        "decision": entry.decision.value,
        "sourceIps": [str(n) for n in entry.source_ips],
    }


def decode_acls(document: object) -> list[UserAcl]:
    acls = []
    for item in _list_of(document, "acls", USERS_MAX):
        if not isinstance(item, dict) or not str(item.get("subject", "")).startswith(
            _SUBJECT_PREFIX
        ):
            raise AuthFileError('acl.json: each acl must be an object with "subject": "User:..."')
        policies = item.get("policies", [])
        if not isinstance(policies, list) or len(policies) > POLICY_ENTRIES_MAX:
            raise AuthFileError(
                f"acl.json: policies must be a list of at most {POLICY_ENTRIES_MAX}"
            )
        entries = tuple(entry_of_doc(p) for p in policies)
        acls.append(UserAcl(str(item["subject"])[len(_SUBJECT_PREFIX) :], entries))
    return acls


def entry_of_doc(doc: object) -> PolicyEntry:
    if not isinstance(doc, dict):
        raise AuthFileError("a policy entry must be an object")
    return entry_of(
        str(doc.get("resource", "")),
        [str(a) for a in doc.get("actions", [])],
        str(doc.get("decision", "Allow")),
        [str(s) for s in doc.get("sourceIps", [])],
    )


def entry_of(resource: str, actions: list[str], decision: str, sources: list[str]) -> PolicyEntry:
    """A checked policy entry; AuthFileError naming what is wrong."""
    try:
        decisions = {d.value.lower(): d for d in Decision}
        if decision.lower() not in decisions:
            raise ValueError(f"decision {decision!r}: expected Allow or Deny")
        if not actions:
            raise ValueError(f"resource {resource!r}: name at least one action")
        return PolicyEntry(
            parse_resource_pattern(resource),
            frozenset(parse_action(a) for a in actions),
            decisions[decision.lower()],
            tuple(parse_network(s) for s in sources),
        )
    except ValueError as exc:
        raise AuthFileError(str(exc)) from None


def _list_of(document: object, key: str, max_items: int) -> list[object]:
    if not isinstance(document, dict) or not isinstance(document.get(key, []), list):
        raise AuthFileError(f'expected an object with "{key}": [...]')
    items: list[object] = document.get(key, [])
    if len(items) > max_items:
        raise AuthFileError(f"{len(items)} {key}; at most {max_items}")
    return items


def _dump(document: object) -> bytes:
    return json.dumps(document, indent=2).encode()

"""``tide up --auth``: a local cluster with authentication and the cluster secret on: an
admin (super) user and a cluster secret generated once under ``<store-dir>/auth`` (mode
0600, kept across runs), and the flags each service needs (docs/security.md)."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

ADMIN_ACCESS_KEY = "admin"
SECRET_BYTES = 24


class _Child(Protocol):
    name: str
    command: list[str]


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)


def prepare(root: Path) -> tuple[Path, Path, Path]:
    """(admin.json for the storages, admin.secret for clients, cluster.secret), made
    when missing."""
    auth_dir = root / "auth"
    auth_dir.mkdir(parents=True, exist_ok=True)
    admin_json = auth_dir / "admin.json"
    admin_secret = auth_dir / "admin.secret"
    cluster_secret = auth_dir / "cluster.secret"
    if not admin_json.exists():
        secret = secrets.token_urlsafe(SECRET_BYTES)
        _write_private(admin_secret, secret)
        _write_private(admin_json, json.dumps({"username": ADMIN_ACCESS_KEY, "password": secret}))
    if not cluster_secret.exists():
        _write_private(cluster_secret, secrets.token_urlsafe(SECRET_BYTES))
    return admin_json, admin_secret, cluster_secret


def add_flags(children: Sequence[_Child], root: Path) -> Path:
    """Each service's flags; returns the admin's secret key file."""
    admin_json, admin_secret, cluster_secret = prepare(root)
    for child in children:
        child.command += ["--cluster-secret-file", str(cluster_secret)]
        if child.name.startswith("storage"):
            child.command += ["--auth-init-user-file", str(admin_json)]
        elif child.name == "gateway":
            child.command += ["--auth-enabled"]
    return admin_secret


def print_admin(admin_secret: Path) -> None:
    print("Authentication is on. The admin (super) user signs with:", flush=True)
    print(
        f"  export TIDE_ACCESS_KEY={ADMIN_ACCESS_KEY} TIDE_SECRET_KEY=$(cat {admin_secret})",
        flush=True,
    )
    print(
        "  then: tide user create NAME; tide acl create NAME Topic:NAME --actions Pub", flush=True
    )

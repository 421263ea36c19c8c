"""The users and ACL policies of this store (``config/users.json``, ``config/acl.json``;
tide.format._auth_files), changed by ChangeAuth on a master and installed from the master's
copies on a slave (metadata_files.py). Written atomically with mode 0600: the files hold
the secret keys the gateways need to check signatures."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from tide.auth.model import PolicyEntry, User
from tide.files import ConfigFormatError, fsync_dir, parse_config_bytes
from tide.format._auth_files import (
    ACL_FILE,
    POLICY_ENTRIES_MAX,
    USERS_FILE,
    USERS_MAX,
    AuthFileError,
    UserAcl,
    decode_acls,
    decode_users,
    encode_acls,
    encode_users,
)

log = logging.getLogger("tide.storage.auth")
FILE_MODE = 0o600


class AuthChangeError(Exception):
    """A change that does not fit: ``kind`` is "exists", "missing" or "invalid"."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class AuthTable:
    def __init__(self, config_dir: Path) -> None:
        self._dir = config_dir
        self._lock = threading.Lock()
        self.users: dict[str, User] = {}
        self.acls: dict[str, tuple[PolicyEntry, ...]] = {}

    def load(self) -> None:
        users = self._read(USERS_FILE, decode_users)
        acls = self._read(ACL_FILE, decode_acls)
        with self._lock:
            self.users = {u.access_key: u for u in users}
            self.acls = {a.access_key: a.entries for a in acls}

    def _read(self, name: str, decode: Callable[[object], list]) -> list:  # type: ignore[type-arg]
        try:
            content = (self._dir / name).read_bytes()
        except FileNotFoundError:
            return []
        try:
            return decode(parse_config_bytes(name, content))
        except AuthFileError as exc:
            raise ConfigFormatError(f"{name}: {exc}") from None

    # --- changes (a master) ---

    def create_user(self, user: User) -> None:
        with self._lock:
            if user.access_key in self.users:
                raise AuthChangeError("exists", f"user {user.access_key!r} exists")
            if len(self.users) >= USERS_MAX:
                raise AuthChangeError("invalid", f"{USERS_MAX} users already (USERS_MAX)")
            self._save_users({**self.users, user.access_key: user})

    def update_user(self, user: User) -> None:
        with self._lock:
            if user.access_key not in self.users:
                raise AuthChangeError("missing", f"no user {user.access_key!r}")
            self._save_users({**self.users, user.access_key: user})

    def delete_user(self, access_key: str) -> None:
        with self._lock:
            if access_key not in self.users:
                raise AuthChangeError("missing", f"no user {access_key!r}")
            users = dict(self.users)
            del users[access_key]
            self._save_users(users)
            if access_key in self.acls:  # its policies go with it
                acls = dict(self.acls)
                del acls[access_key]
                self._save_acls(acls)

    def create_acl(self, access_key: str, entries: tuple[PolicyEntry, ...]) -> None:
        with self._lock:
            self._need_user(access_key)
            if access_key in self.acls:
                raise AuthChangeError("exists", f"user {access_key!r} has an ACL; update it")
            self._save_acls({**self.acls, access_key: _bounded(entries)})

    def update_acl(self, access_key: str, entries: tuple[PolicyEntry, ...]) -> None:
        """Entries for the resources given replace those the user had; others are added."""
        with self._lock:
            self._need_user(access_key)
            replaced = {e.resource for e in entries}
            kept = tuple(e for e in self.acls.get(access_key, ()) if e.resource not in replaced)
            self._save_acls({**self.acls, access_key: _bounded(kept + entries)})

    def delete_acl(self, access_key: str, entries: tuple[PolicyEntry, ...]) -> None:
        """The entries on the resources given; the whole ACL when none is given."""
        with self._lock:
            if access_key not in self.acls:
                raise AuthChangeError("missing", f"user {access_key!r} has no ACL")
            acls = dict(self.acls)
            if entries:
                gone = {e.resource for e in entries}
                acls[access_key] = tuple(e for e in acls[access_key] if e.resource not in gone)
            else:
                del acls[access_key]
            self._save_acls(acls)

    def _need_user(self, access_key: str) -> None:
        if access_key not in self.users:
            raise AuthChangeError("missing", f"no user {access_key!r} (create it first)")

    def _save_users(self, users: dict[str, User]) -> None:
        write_private(self._dir / USERS_FILE, encode_users(list(users.values())))
        self.users = users

    def _save_acls(self, acls: dict[str, tuple[PolicyEntry, ...]]) -> None:
        content = encode_acls([UserAcl(k, v) for k, v in acls.items()])
        write_private(self._dir / ACL_FILE, content)
        self.acls = acls

    # --- a master's copies (a slave) ---

    def install_users(self, content: bytes) -> None:
        users = self._decoded(USERS_FILE, content, decode_users)
        with self._lock:
            write_private(self._dir / USERS_FILE, content)
            self.users = {u.access_key: u for u in users}

    def install_acls(self, content: bytes) -> None:
        acls = self._decoded(ACL_FILE, content, decode_acls)
        with self._lock:
            write_private(self._dir / ACL_FILE, content)
            self.acls = {a.access_key: a.entries for a in acls}

    @staticmethod
    def _decoded(name: str, content: bytes, decode: Callable[[object], list]) -> list:  # type: ignore[type-arg]
        try:
            return decode(parse_config_bytes(name, content))
        except AuthFileError as exc:
            raise ConfigFormatError(f"{name}: {exc}") from None


def _bounded(entries: tuple[PolicyEntry, ...]) -> tuple[PolicyEntry, ...]:
    if len(entries) > POLICY_ENTRIES_MAX:
        raise AuthChangeError(
            "invalid", f"{len(entries)} policy entries; at most {POLICY_ENTRIES_MAX} per user"
        )
    return entries


class _Installer:
    def __init__(self, install: Callable[[bytes], None]) -> None:
        self.install = install


def installers(table: AuthTable) -> dict[str, _Installer]:
    """The metadata-file installers of the two files (metadata_files.MetadataTable)."""
    return {USERS_FILE: _Installer(table.install_users), ACL_FILE: _Installer(table.install_acls)}


def write_private(path: Path, content: bytes) -> None:
    """Replace ``path`` with ``content`` atomically, readable by this user only (0600
    from creation: the temporary file is never readable by others either)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    log.debug("wrote %s (%d bytes)", path.name, len(content))

"""The storage's users and ACLs (engine/auth_table.py): changes written atomically with
mode 0600 and loaded back, update semantics, a slave's install checked whole first."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from services.storage.engine.auth_table import AuthChangeError, AuthTable
from tide.auth.model import PolicyEntry, User, UserType
from tide.files import ConfigFormatError
from tide.format._auth_files import entry_of


def _entry(resource: str, *actions: str, decision: str = "Allow") -> PolicyEntry:
    return entry_of(resource, list(actions), decision, [])


def test_changes_persist_private_and_load_back(tmp_path: Path) -> None:
    table = AuthTable(tmp_path)
    table.create_user(User("alice", "alice-secret", UserType.NORMAL))
    table.create_acl("alice", (_entry("Topic:a", "Pub"), _entry("Topic:b*", "Sub")))
    for name in ("users.json", "acl.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.bak"))
    again = AuthTable(tmp_path)
    again.load()
    assert again.users["alice"].secret_key == "alice-secret"
    assert [str(e.resource) for e in again.acls["alice"]] == ["Topic:a", "Topic:b*"]


def test_update_replaces_entries_on_the_same_resource(tmp_path: Path) -> None:
    table = AuthTable(tmp_path)
    table.create_user(User("alice", "alice-secret"))
    table.create_acl("alice", (_entry("Topic:a", "Pub"),))
    table.update_acl("alice", (_entry("Topic:a", "Sub"), _entry("Group:*", "Sub")))
    assert [(str(e.resource), sorted(a.value for a in e.actions)) for e in table.acls["alice"]] == [
        ("Topic:a", ["Sub"]),
        ("Group:*", ["Sub"]),
    ]
    table.delete_acl("alice", (_entry("Topic:a", "All"),))
    assert [str(e.resource) for e in table.acls["alice"]] == ["Group:*"]
    table.delete_user("alice")  # and its ACL
    assert "alice" not in table.acls


def test_changes_that_do_not_fit_are_named(tmp_path: Path) -> None:
    table = AuthTable(tmp_path)
    table.create_user(User("alice", "alice-secret"))
    with pytest.raises(AuthChangeError, match="exists") as caught:
        table.create_user(User("alice", "other-secret"))
    assert caught.value.kind == "exists" and "secret" not in caught.value.message
    with pytest.raises(AuthChangeError, match="create it first"):
        table.create_acl("bob", ())
    with pytest.raises(AuthChangeError, match="no user"):
        table.update_user(User("bob", "bob-secret-1"))


def test_a_malformed_master_copy_is_refused_and_the_old_file_kept(tmp_path: Path) -> None:
    table = AuthTable(tmp_path)
    table.create_user(User("alice", "alice-secret"))
    before = (tmp_path / "users.json").read_bytes()
    with pytest.raises(ConfigFormatError, match=r"users\.json"):
        table.install_users(b'{"users": [{"username": "x", "password": "short"}]}')
    with pytest.raises(ConfigFormatError, match="not valid JSON"):
        table.install_acls(b"{")
    assert (tmp_path / "users.json").read_bytes() == before
    assert "alice" in table.users

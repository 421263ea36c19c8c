"""Consumer group configs: ``config/subscriptionGroup.json`` (RocketMQ's SubscriptionGroupManager).

The layout is tide.format's (docs/formats.md, "config/subscriptionGroup.json"). Like the
topic table, every change is written with :func:`write_json_atomically` before it becomes
visible and bumps the data version; a full disk surfaces as the OSError it is (the
servicer answers it as the store's disk-full state). A group without a config has
RocketMQ's defaults (:func:`default_group`).
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tide.files import (
    ConfigFormatError,
    ConfigLimitError,
    load_json_with_fallback,
    parse_config_bytes,
    write_json_atomically,
    write_json_bytes_atomically,
)
from tide.format import (
    MAX_SUBSCRIPTION_GROUPS,
    SUBSCRIPTION_GROUP_FILE,
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
    decode_subscription_groups,
    encode_subscription_groups,
)
from tide.quoting import quote

__all__ = ["SUBSCRIPTION_GROUP_FILE", "GroupTable", "default_group"]


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def default_group(group: str) -> SubscriptionGroupConfig:
    """The config of a group nobody configured (ValueError for a bad name)."""
    try:
        return SubscriptionGroupConfig(group_name=group)
    except ConfigFormatError as exc:
        raise ValueError(str(exc)) from exc


class GroupTable:
    """Thread-safe group table persisted in ``<config_dir>/subscriptionGroup.json``,
    bounded to ``max_groups`` groups. The forbidden table (RocketMQ's per-group topic
    permissions) is kept as read and written back unchanged."""

    def __init__(
        self,
        config_dir: Path,
        *,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        max_groups: int = MAX_SUBSCRIPTION_GROUPS,
    ) -> None:
        config_dir.mkdir(parents=True, exist_ok=True)
        self._path = config_dir / SUBSCRIPTION_GROUP_FILE
        self._clock_ms = clock_ms
        self._max_groups = max_groups
        self._lock = threading.Lock()
        self._table = _load(self._path, max_groups)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def table(self) -> SubscriptionGroupTable:
        """The whole table as it is on disk (immutable)."""
        with self._lock:
            return self._table

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        with self._lock:
            return self._table.groups.get(group)

    def get_or_default(self, group: str) -> tuple[SubscriptionGroupConfig, bool]:
        """The group's config and True, or the defaults and False."""
        found = self.get(group)
        return (found, True) if found is not None else (default_group(group), False)

    def list(self) -> builtins.list[SubscriptionGroupConfig]:
        """Every configured group, sorted by name."""
        with self._lock:
            groups = self._table.groups
            return [groups[name] for name in sorted(groups)]

    def upsert(self, cfg: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Create or replace a group's config; an identical config changes nothing."""
        with self._lock:
            groups = self._table.groups
            if groups.get(cfg.group_name) == cfg:
                return cfg
            if cfg.group_name not in groups and len(groups) >= self._max_groups:
                raise ConfigLimitError(
                    f"cannot create group {quote(cfg.group_name)}: the table already holds "
                    f"the limit of {self._max_groups} groups (MAX_SUBSCRIPTION_GROUPS); "
                    "delete unused groups"
                )
            self._apply({**groups, cfg.group_name: cfg})
        return cfg

    def delete(self, group: str) -> bool:
        """Remove a group's config (it has the defaults again); False when it had none."""
        with self._lock:
            groups = dict(self._table.groups)
            if groups.pop(group, None) is None:
                return False
            self._apply(groups)
        return True

    def install(self, content: bytes) -> None:
        """Adopt another store's ``subscriptionGroup.json`` byte for byte (a slave's copy
        of its master's; engine/metadata_files.py's MetadataTable): checked whole first
        (ConfigFormatError or ConfigLimitError, nothing written), written atomically, then
        the table and its data version are the file's."""
        doc = parse_config_bytes(SUBSCRIPTION_GROUP_FILE, content)
        table = decode_subscription_groups(doc)
        if len(table.groups) > self._max_groups:
            raise ConfigLimitError(
                f"{SUBSCRIPTION_GROUP_FILE} holds {len(table.groups)} groups; the limit is "
                f"{self._max_groups}"
            )
        with self._lock:
            write_json_bytes_atomically(self._path, content)
            self._table = table

    def _apply(self, groups: dict[str, SubscriptionGroupConfig]) -> None:
        """Persist the table with ``groups``, then adopt it. Holds the lock."""
        old = self._table
        table = SubscriptionGroupTable(
            groups=groups,
            forbidden=old.forbidden,
            data_version=old.data_version.next(self._clock_ms()),
        )
        write_json_atomically(self._path, encode_subscription_groups(table))
        self._table = table


def _load(path: Path, max_groups: int) -> SubscriptionGroupTable:
    doc, _source = load_json_with_fallback(path)
    if doc is None:
        return SubscriptionGroupTable(groups={})
    try:
        table = decode_subscription_groups(doc)
    except ConfigFormatError as exc:
        raise ConfigFormatError(f"{path}: {exc}") from exc
    if len(table.groups) > max_groups:
        raise ConfigLimitError(
            f"{path} holds {len(table.groups)} groups; the limit is {max_groups}"
        )
    return table

"""The broker's metadata files under ``config/``, as a master serves them to its slaves
and a slave installs its master's copies (RocketMQ's SlaveSynchronize), and the delivery
progress the master's dispatch hands over (SaveDeliveryProgress).

Files: ``topics.json``, ``consumerOffset.json``, ``subscriptionGroup.json``,
``delayOffset.json``, ``timercheck``, ``producerState.json``, ``transactionChecks.json``,
``users.json``, ``acl.json`` (docs/formats.md). A table
held in memory installs its own file (:class:`MetadataTable`: the topic table, the
consumer offsets, the producer state, the group table once registered); the others are
plain files, checked and written here. Every install checks the content whole before
writing anything and writes it atomically, so a file is never half written and never
replaced by one this store could not load.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from services.storage.engine.consumer_offsets import CONSUMER_OFFSETS_FILE
from services.storage.engine.topic_table import TOPICS_FILE
from tide.files import (
    ConfigFormatError,
    ConfigLimitError,
    parse_config_bytes,
    write_file_atomically,
    write_json_bytes_atomically,
)
from tide.format import (
    DELAY_OFFSET_FILE,
    PRODUCER_STATE_FILE,
    SUBSCRIPTION_GROUP_FILE,
    TIMER_CHECKPOINT_BYTES,
    TIMER_CHECKPOINT_FILE,
    TIMER_CHECKPOINT_FILE_BYTES,
    TRANSACTION_CHECKS_FILE,
    TimerCheckpoint,
    decode_delay_offsets,
    decode_subscription_groups,
    decode_transaction_checks,
)
from tide.format._auth_files import ACL_FILE, USERS_FILE
from tide.limits import (
    DELAY_OFFSETS_MAX_BYTES,
    METADATA_MAX_BYTES,
    TRANSACTION_CHECKS_MAX_BYTES,
    limit_text,
)

log = logging.getLogger("tide.storage.metadata")

# In the order a slave installs them: topics before the offsets and groups that name them.
METADATA_FILES = (
    TOPICS_FILE,
    CONSUMER_OFFSETS_FILE,
    SUBSCRIPTION_GROUP_FILE,
    DELAY_OFFSET_FILE,
    TIMER_CHECKPOINT_FILE,
    PRODUCER_STATE_FILE,
    TRANSACTION_CHECKS_FILE,
    USERS_FILE,
    ACL_FILE,
)


class MetadataTable(Protocol):
    """A table that holds one metadata file in memory and installs another store's copy:
    check ``content`` whole (raise ConfigFormatError or ConfigLimitError, writing
    nothing), write it atomically as its file, then serve it."""

    def install(self, content: bytes) -> None: ...


class _JsonFile:
    """A JSON file the storage keeps without a table of its own: checked with ``decode``
    (tide.format), kept byte for byte."""

    def __init__(self, path: Path, decode: Callable[[object], object]) -> None:
        self._path = path
        self._decode = decode

    def install(self, content: bytes) -> None:
        self._decode(parse_config_bytes(self._path.name, content))
        write_json_bytes_atomically(self._path, content)


class _TimerCheckpointFile:
    """``timercheck``: one 4 KiB page, the first 56 bytes used (docs/formats.md)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def install(self, content: bytes) -> None:
        if not TIMER_CHECKPOINT_BYTES <= len(content) <= TIMER_CHECKPOINT_FILE_BYTES:
            raise ConfigFormatError(
                f"{TIMER_CHECKPOINT_FILE} is {len(content)} bytes; it must be "
                f"{TIMER_CHECKPOINT_BYTES}..{TIMER_CHECKPOINT_FILE_BYTES}"
            )
        write_file_atomically(self._path, content)


class MetadataFiles:
    """One store's metadata files. Thread-safe: one install or save at a time."""

    def __init__(self, config_dir: Path, before_read: Callable[[], object] = lambda: None) -> None:
        """``before_read``: brings the files up to date with memory before a read (the
        consumer offsets persist their unwritten commits)."""
        self._dir = config_dir
        self._before_read = before_read
        self._lock = threading.Lock()
        self._tables: dict[str, MetadataTable] = {
            SUBSCRIPTION_GROUP_FILE: _JsonFile(
                config_dir / SUBSCRIPTION_GROUP_FILE, decode_subscription_groups
            ),
            DELAY_OFFSET_FILE: _JsonFile(config_dir / DELAY_OFFSET_FILE, decode_delay_offsets),
            TIMER_CHECKPOINT_FILE: _TimerCheckpointFile(config_dir / TIMER_CHECKPOINT_FILE),
            TRANSACTION_CHECKS_FILE: _JsonFile(
                config_dir / TRANSACTION_CHECKS_FILE, _decode_transaction_checks
            ),
        }

    def register(self, name: str, table: MetadataTable) -> None:
        """``table`` installs the file ``name`` from now on (and reloads itself)."""
        if name not in METADATA_FILES:
            raise ValueError(f"{name!r} is not a metadata file: one of {METADATA_FILES}")
        with self._lock:
            self._tables[name] = table

    def read(self, max_bytes: int = METADATA_MAX_BYTES) -> list[tuple[str, bytes]]:
        """Every metadata file there is, as it is on disk (a file never written is left
        out), at most ``max_bytes`` together (ConfigLimitError naming each size)."""
        try:
            self._before_read()
        except OSError as exc:  # a full disk: serve the files as they are (older offsets)
            log.warning("metadata files read without the latest consumer offsets: %s", exc)
        files: list[tuple[str, bytes]] = []
        total = 0
        for name in METADATA_FILES:
            try:
                with open(self._dir / name, "rb") as file:  # replaced by rename: whole
                    content = file.read(max_bytes - total + 1)
            except FileNotFoundError:
                continue
            total += len(content)
            files.append((name, content))
            if total > max_bytes:
                raise ConfigLimitError(self._too_large(max_bytes))
        return files

    def _too_large(self, max_bytes: int) -> str:
        sizes = []
        for name in METADATA_FILES:
            path = self._dir / name
            if path.exists():
                sizes.append(f"{name} {path.stat().st_size} bytes")
        what = limit_text("METADATA_MAX_BYTES") if max_bytes == METADATA_MAX_BYTES else max_bytes
        return (
            f"the metadata files ({', '.join(sizes)}) are over the {what} one GetMetadata "
            "returns: shrink the tables (delete unused topics, groups or offsets)"
        )

    def install(self, name: str, content: bytes) -> bool:
        """Make the file ``name`` hold ``content`` (a master's copy); False when it
        already did. Raises what the check or the write raises, leaving the old file."""
        if name not in METADATA_FILES:
            raise ValueError(f"{name!r} is not a metadata file: one of {METADATA_FILES}")
        with self._lock:
            if self._current(name) == content:
                return False
            self._tables[name].install(content)
        return True

    def _current(self, name: str) -> bytes | None:
        try:
            return (self._dir / name).read_bytes()
        except FileNotFoundError:
            return None

    def save_delivery_progress(
        self,
        delay_offsets_json: bytes,
        timer_checkpoint: bytes,
        transaction_checks_json: bytes = b"",
    ) -> None:
        """The dispatch's progress (an empty field: unchanged): all checked before any is
        written (ValueError says what is wrong)."""
        if len(delay_offsets_json) > DELAY_OFFSETS_MAX_BYTES:
            raise ValueError(
                f"delay_offsets_json is {len(delay_offsets_json)} bytes; the limit is "
                f"{limit_text('DELAY_OFFSETS_MAX_BYTES')}"
            )
        if len(transaction_checks_json) > TRANSACTION_CHECKS_MAX_BYTES:
            raise ValueError(
                f"transaction_checks_json is {len(transaction_checks_json)} bytes; the limit "
                f"is {limit_text('TRANSACTION_CHECKS_MAX_BYTES')}"
            )
        if timer_checkpoint and len(timer_checkpoint) != TIMER_CHECKPOINT_BYTES:
            raise ValueError(
                f"timer_checkpoint is {len(timer_checkpoint)} bytes; it must be the "
                f"checkpoint's {TIMER_CHECKPOINT_BYTES} (TimerCheckpoint.pack)"
            )
        if delay_offsets_json:
            doc = parse_config_bytes("delay_offsets_json", delay_offsets_json)
            try:
                decode_delay_offsets(doc)
            except ConfigFormatError as exc:
                raise ConfigFormatError(f"delay_offsets_json: {exc}") from None
        if transaction_checks_json:
            doc = parse_config_bytes("transaction_checks_json", transaction_checks_json)
            try:
                _decode_transaction_checks(doc)
            except ConfigFormatError as exc:
                raise ConfigFormatError(f"transaction_checks_json: {exc}") from None
        updates: Sequence[tuple[str, bytes]] = [
            (DELAY_OFFSET_FILE, delay_offsets_json),
            # The whole 4 KiB page, as RocketMQ's config/timercheck is.
            (TIMER_CHECKPOINT_FILE, _timer_page(timer_checkpoint)),
            (TRANSACTION_CHECKS_FILE, transaction_checks_json),
        ]
        for name, content in updates:
            if content:
                self.install(name, content)


def _timer_page(checkpoint: bytes) -> bytes:
    if not checkpoint:
        return b""
    return TimerCheckpoint.unpack(checkpoint).pack_file()


def _decode_transaction_checks(document: object) -> object:
    """tide.format's check of the dispatch's check counts, as a ConfigFormatError."""
    try:
        return decode_transaction_checks(document)
    except ValueError as exc:
        raise ConfigFormatError(str(exc)) from None

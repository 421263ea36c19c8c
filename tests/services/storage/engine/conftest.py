"""Shared helpers for the storage engine's write-path tests.

Every store is a real one in ``tmp_path`` (real segment files, real threads). The only
thing injected is the disk usage ratio, so that a nearly full host disk cannot make a
test refuse writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from services.storage.engine.config import StoreConfig
from services.storage.engine.message_codec import MessageInput
from services.storage.engine.message_store import MessageStore
from tide.format import DecodedRecord, ScanKind, decode_record, scan_record, segment_name

SEGMENT_BYTES = 128 * 1024
MAX_BODY_BYTES = 64 * 1024
# formats.md: with IPv4 hosts a record is 91 + body + topic + properties bytes.
FIXED_RECORD_BYTES_V4 = 91
BLANK_BYTES = 8
BLANK_MAGIC = -875286124  # 0xCBD43194
TIMEOUT_S = 20.0
LOW_DISK_USAGE = 0.10
Position = tuple[int, int, int]  # physical offset, size, queue offset


class StoreFactory(Protocol):
    def __call__(
        self,
        *,
        store_dir: Path | None = None,
        clock_ms: Callable[[], int] | None = None,
        **overrides: Any,
    ) -> MessageStore: ...


def make_config(store_dir: Path, **overrides: Any) -> StoreConfig:
    settings: dict[str, Any] = {
        "segment_size_bytes": SEGMENT_BYTES,
        "max_message_body_bytes": MAX_BODY_BYTES,
    }
    settings.update(overrides)
    return StoreConfig(store_dir=store_dir, **settings)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def make_store(store_dir: Path) -> Iterator[StoreFactory]:
    """Open a store (default dir ``tmp_path/store``); every store opened is closed after
    the test (closing twice is a no-op)."""
    stores: list[MessageStore] = []

    def factory(
        *,
        store_dir: Path | None = None,
        clock_ms: Callable[[], int] | None = None,
        **overrides: Any,
    ) -> MessageStore:
        config = make_config(store_dir or default_dir, **overrides)
        store = MessageStore(config, clock_ms=clock_ms, usage_ratio=lambda: LOW_DISK_USAGE)
        store.open()
        stores.append(store)
        return store

    default_dir = store_dir
    yield factory
    for store in reversed(stores):
        store.close()


def msg(
    topic: str = "T",
    queue_id: int = 0,
    body: bytes = b"body",
    **fields: Any,
) -> MessageInput:
    return MessageInput(topic=topic, queue_id=queue_id, body=body, **fields)


def msg_of_size(size: int, topic: str = "T", queue_id: int = 0) -> MessageInput:
    """A message (IPv4 hosts, no properties) whose record is exactly ``size`` bytes."""
    body_len = size - FIXED_RECORD_BYTES_V4 - len(topic.encode())
    assert 0 <= body_len <= MAX_BODY_BYTES, (size, body_len)
    return msg(topic, queue_id, bytes([body_len % 251]) * body_len)


MIN_RECORD_BYTES = FIXED_RECORD_BYTES_V4 + 1  # topic "T", empty body
MAX_RECORD_BYTES = FIXED_RECORD_BYTES_V4 + 1 + MAX_BODY_BYTES


def fill_segment(
    store: MessageStore, *, leave_bytes: int, topic: str = "T", queue_id: int = 0
) -> list[Position]:
    """Append records (topic ``topic``) until exactly ``leave_bytes`` are left in the
    segment being written."""
    size_bytes = store.config.segment_size_bytes
    need = size_bytes - store.status().max_offset % size_bytes - leave_bytes
    assert need >= 0, need
    positions: list[Position] = []
    while need > 0:
        size = min(need, MAX_RECORD_BYTES - 1)
        if 0 < need - size < MIN_RECORD_BYTES:
            size = need - MIN_RECORD_BYTES
        positions += store.put([msg_of_size(size, topic, queue_id)]).batch.positions
        need -= size
    assert size_bytes - store.status().max_offset % size_bytes == leave_bytes
    return positions


def segment_path(store_dir: Path, start_offset: int) -> Path:
    return store_dir / "commitlog" / segment_name(start_offset)


def read_records(store: MessageStore) -> list[DecodedRecord]:
    """Every record in the readable commitlog, in order, via ``CommitLog.read_raw``."""
    records: list[DecodedRecord] = []
    size_bytes = store.config.segment_size_bytes
    status = store.status()
    for start in range(status.min_offset, status.max_offset, size_bytes):
        offset, data = store.commitlog.read_raw(start, size_bytes)
        assert offset == start
        pos = 0
        while pos < len(data):
            scan = scan_record(data, pos, len(data), expected_offset=start + pos)
            if scan.kind is ScanKind.BLANK:
                assert start + size_bytes <= status.max_offset, "blank in the last segment"
                break
            if scan.kind is ScanKind.END:
                break
            assert scan.kind is ScanKind.RECORD, (start + pos, scan)
            records.append(decode_record(data, pos, len(data), expected_offset=start + pos))
            pos += scan.size
    return records

"""Helpers for the recovery and retention tests: real store directories, in-process stores.

A *crash* here is what a SIGKILL leaves behind, simulated in-process: the background
threads are stopped and the mappings closed, but nothing of the clean close path runs
(no final snapshot, no checkpoint write, the ``abort`` file stays). Everything appended
is in the page cache, so it is in the files the next store opens.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.storage.engine.config import StoreConfig
from services.storage.engine.message_codec import MessageInput
from services.storage.engine.message_store import MessageStore
from tide.format import (
    CHECKPOINT_FILE_BYTES,
    SNAPSHOT_FILE,
    Checkpoint,
    DecodedRecord,
    ScanKind,
    decode_record,
    read_snapshot,
    record_size,
    scan_record,
    segment_name,
)

# The smallest segment the config accepts with 8 KiB bodies (body + 64 KiB of headroom).
SEGMENT_BYTES = 72 * 1024
MAX_BODY_BYTES = 8 * 1024
HOUR_S = 3600.0
HOUR_MS = 3_600_000
# Long enough that a background thread never runs on its own during a test.
NEVER_MS = 3_600_000
# Where the body starts in a record with IPv4 hosts: the fixed header is 88 bytes.
BODY_POS = 88
QueueKey = tuple[str, int]


@dataclass(frozen=True)
class Written:
    """One appended record, as the append reported it."""

    offset: int
    size: int
    queue_offset: int
    topic: str
    queue_id: int
    body: bytes


def make_config(store_dir: Path, **overrides: Any) -> StoreConfig:
    settings: dict[str, Any] = {
        "store_dir": store_dir,
        "segment_size_bytes": SEGMENT_BYTES,
        "max_message_body_bytes": MAX_BODY_BYTES,
        "cleanup_interval_ms": NEVER_MS,
        "checkpoint_interval_ms": NEVER_MS,
    }
    settings.update(overrides)
    return StoreConfig(**settings)


@dataclass
class Harness:
    """Opens stores on one directory and makes sure none is left open after a test."""

    store_dir: Path
    ratio: list[float] = field(default_factory=lambda: [0.10])
    opened: list[MessageStore] = field(default_factory=list)

    def open(
        self,
        *,
        clock_ms: Callable[[], int] | None = None,
        clock_s: Callable[[], float] | None = None,
        **overrides: Any,
    ) -> MessageStore:
        store = MessageStore(
            make_config(self.store_dir, **overrides),
            clock_ms=clock_ms,
            clock_s=clock_s,
            usage_ratio=lambda: self.ratio[0],
        )
        store.open()
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            if store._opened:
                store.close()
        self.opened.clear()

    @property
    def commitlog_dir(self) -> Path:
        return self.store_dir / "commitlog"

    def segment_path(self, start_offset: int) -> Path:
        return self.commitlog_dir / segment_name(start_offset)

    @property
    def abort_path(self) -> Path:
        return self.store_dir / "abort"


def crash(store: MessageStore, *, durable: bool = False) -> None:
    """Stop ``store`` the way a SIGKILL would: no final snapshot or checkpoint, the
    ``abort`` file stays. The threads are stopped only so that nothing touches the
    files afterwards. ``durable``: first flush and record everything as durable, as the
    checkpoint service does within 10 s (bad bytes then are corruption, never a torn
    write)."""
    assert store._opened
    if durable:
        record_durable(store)
    store._opened = False
    store.allocator.stop()
    for thread in store._threads:
        thread.stop()
    store.segments.close()
    store._lock.release()
    assert (store.config.store_dir / "abort").exists()


def record_durable(store: MessageStore) -> None:
    """Flush, and record the end of the log as durable (the snapshot's flushedOffset),
    as the checkpoint service does within 10 s of a flush."""
    store.segments.flush(0)
    store.checkpoint_service.write_final()
    snapshot = read_snapshot(store.config.store_dir)
    assert snapshot is not None and snapshot.flushed_offset == store.segments.max_offset


def message(topic: str, queue_id: int, body: bytes) -> MessageInput:
    return MessageInput(topic=topic, queue_id=queue_id, body=body)


def body_for(index: int, size: int) -> bytes:
    stamp = f"m{index:06d}-".encode()
    return (stamp * (size // len(stamp) + 1))[:size]


def put(store: MessageStore, messages: Iterable[MessageInput]) -> list[Written]:
    batch = list(messages)
    result = store.put(batch)
    return [
        Written(offset, size, queue_offset, msg.topic, msg.queue_id, bytes(msg.body))
        for (offset, size, queue_offset), msg in zip(result.batch.positions, batch, strict=True)
    ]


def put_many(
    store: MessageStore,
    count: int,
    *,
    topics: tuple[str, ...] = ("TopicA", "TopicB"),
    queues: int = 4,
    body_bytes: int = 700,
    start: int = 0,
) -> list[Written]:
    """``count`` messages round-robin over topics and queues, one append each."""
    written: list[Written] = []
    for index in range(start, start + count):
        topic = topics[index % len(topics)]
        queue_id = (index // len(topics)) % queues
        size = body_bytes + (index % 7) * 31  # records of varying sizes
        written += put(store, [message(topic, queue_id, body_for(index, size))])
    return written


def fixed_record_bytes(topic: str, body_bytes: int) -> int:
    """Size of a record with no properties and IPv4 hosts."""
    return record_size(body_bytes, len(topic.encode()), 0)


def room_in_last_segment(store: MessageStore) -> int:
    last = store.segments.last()
    return 0 if last is None else last.size_bytes - last.wrote


def fill_segments(
    store: MessageStore,
    count: int,
    *,
    topic: str = "Fill",
    queues: int = 2,
    body_bytes: int = 1000,
    on_roll: Callable[[int], None] | None = None,
) -> list[Written]:
    """Append fixed-size records until ``count`` segments are full: the next such record
    would start segment ``count``. ``on_roll(k)`` is called just before the append whose
    record is the first of segment ``k``."""
    written: list[Written] = []
    needed = fixed_record_bytes(topic, body_bytes) + 8
    index = 0
    while True:
        segments = store.segments.segments
        if not segments:
            new_segment: int | None = 0
        elif room_in_last_segment(store) < needed:
            new_segment = len(segments)
        else:
            new_segment = None
        if new_segment is not None:
            if new_segment >= count:
                return written
            if on_roll is not None:
                on_roll(new_segment)
        written += put(store, [message(topic, index % queues, body_for(index, body_bytes))])
        index += 1


def next_offsets_of(written: Iterable[Written]) -> dict[QueueKey, int]:
    result: dict[QueueKey, int] = {}
    for w in written:
        key = (w.topic, w.queue_id)
        result[key] = max(result.get(key, 0), w.queue_offset + 1)
    return result


def read_all(store: MessageStore) -> list[DecodedRecord]:
    """Every record of the commitlog, from the min offset to the first non-record."""
    records: list[DecodedRecord] = []
    for segment in store.segments.segments:
        pos = 0
        while pos < segment.wrote:
            scan = scan_record(
                segment.mm, pos, segment.size_bytes, expected_offset=segment.start_offset + pos
            )
            if scan.kind is ScanKind.BLANK:
                break
            assert scan.kind is ScanKind.RECORD, (segment, pos, scan)
            records.append(
                decode_record(
                    segment.mm,
                    pos,
                    segment.size_bytes,
                    expected_offset=segment.start_offset + pos,
                )
            )
            pos += scan.size
    return records


def assert_contiguous_queue_offsets(records: Iterable[DecodedRecord]) -> dict[QueueKey, int]:
    """Each queue's offsets must be 0, 1, 2, ... in commitlog order. Returns next offsets."""
    seen: dict[QueueKey, list[int]] = {}
    for record in records:
        seen.setdefault((record.topic, record.queue_id), []).append(record.queue_offset)
    for key, offsets in seen.items():
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (key, offsets)
    return {key: offsets[-1] + 1 for key, offsets in seen.items()}


def write_checkpoint(store_dir: Path, timestamp_ms: int) -> None:
    data = Checkpoint(timestamp_ms, timestamp_ms, timestamp_ms, 0, 0).pack()
    assert len(data) == CHECKPOINT_FILE_BYTES
    (store_dir / "checkpoint").write_bytes(data)


def remove_snapshot(store_dir: Path) -> None:
    for name in (SNAPSHOT_FILE, SNAPSHOT_FILE + ".bak", SNAPSHOT_FILE + ".tmp"):
        (store_dir / name).unlink(missing_ok=True)


def patch_file(path: Path, position: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        assert os.pwrite(fd, data, position) == len(data)
    finally:
        os.close(fd)


def read_file(path: Path, position: int, size: int) -> bytes:
    with path.open("rb") as f:
        f.seek(position)
        return f.read(size)


def create_empty_segment(path: Path, size_bytes: int = SEGMENT_BYTES) -> None:
    """A segment file as the allocator leaves it: the right size, all zeros."""
    with path.open("wb") as f:
        f.truncate(size_bytes)

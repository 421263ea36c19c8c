"""The (topic, queue_id) -> next queue offset table, and its snapshot file.

Queue offsets are assigned at append time. So that a restart does not rescan the whole
commitlog, the table is snapshotted (``queue_offsets.json`` in the store root, Tide's
own file) together with the commitlog offset it is consistent with. Recovery loads the
snapshot and replays the records after that offset. Replay is idempotent: a record sets
its queue's next offset to ``max(current, record.queue_offset + 1)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tide.files import (
    ConfigFileError,
    load_json_with_fallback,
    write_json_atomically,
)

log = logging.getLogger("tide.storage.queue_offsets")
SNAPSHOT_FILE = "queue_offsets.json"
QueueKey = tuple[str, int]


@dataclass
class Snapshot:
    # Every record below this commitlog offset is counted in `next_offsets`.
    commitlog_offset: int
    # The durable prefix when the snapshot was written (tells torn tails from corruption).
    flushed_offset: int
    next_offsets: dict[QueueKey, int]


class QueueOffsetTable:
    def __init__(self) -> None:
        self.next_offsets: dict[QueueKey, int] = {}

    def replay(self, topic: str, queue_id: int, queue_offset: int) -> None:
        key = (topic, queue_id)
        if queue_offset + 1 > self.next_offsets.get(key, 0):
            self.next_offsets[key] = queue_offset + 1

    def remove_topic(self, topic: str) -> None:
        for key in [k for k in self.next_offsets if k[0] == topic]:
            del self.next_offsets[key]


def write_snapshot(store_dir: Path, snapshot: Snapshot) -> None:
    obj = {
        "commitlogOffset": snapshot.commitlog_offset,
        "flushedOffset": snapshot.flushed_offset,
        "queueOffsets": {f"{t}-{q}": n for (t, q), n in sorted(snapshot.next_offsets.items())},
    }
    write_json_atomically(store_dir / SNAPSHOT_FILE, obj)


def read_snapshot(store_dir: Path) -> Snapshot | None:
    try:
        obj, source = load_json_with_fallback(store_dir / SNAPSHOT_FILE)
    except ConfigFileError as exc:
        log.error("%s; rebuilding queue offsets by scan", exc)
        return None
    if obj is None:
        return None
    try:
        offsets: dict[QueueKey, int] = {}
        for name, next_offset in obj["queueOffsets"].items():
            topic, _, queue = str(name).rpartition("-")
            offsets[(topic, int(queue))] = int(next_offset)
        return Snapshot(int(obj["commitlogOffset"]), int(obj["flushedOffset"]), offsets)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        log.error("queue offset snapshot %s unusable (%s); rebuilding by scan", source, exc)
        return None


__all__ = ["QueueOffsetTable", "Snapshot", "read_snapshot", "write_snapshot"]

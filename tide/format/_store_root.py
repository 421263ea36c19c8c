"""The small files of a store root that recovery and the offline tools read.

* ``abort``: exists while a process has the store open; left behind by a crash.
* ``checkpoint``: the 4 KiB RocketMQ checkpoint (layout in ``_checkpoint``).
* ``queue_offsets.json`` (Tide only): a snapshot of the (topic, queue) -> next queue
  offset table, the commitlog offset it is consistent with, and the flushed offset when
  it was written: ``{"commitlogOffset", "flushedOffset", "queueOffsets":
  {"<topic>-<queue>": next}}``.

:func:`read_tail_marks` turns them into what tells a crash's torn tail from corruption
(:class:`tide.format.TailMarks`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tide.files import ConfigFileError, load_json_with_fallback, write_json_atomically
from tide.format._resync import TailMarks

log = logging.getLogger("tide.format.store_root")
ABORT_FILE = "abort"
CHECKPOINT_FILE = "checkpoint"
SNAPSHOT_FILE = "queue_offsets.json"
QueueKey = tuple[str, int]


@dataclass
class Snapshot:
    # Every record below this commitlog offset is counted in `next_offsets`.
    commitlog_offset: int
    # The durable prefix when the snapshot was written (tells torn tails from corruption).
    flushed_offset: int
    next_offsets: dict[QueueKey, int]


def write_snapshot(store_dir: Path, snapshot: Snapshot) -> None:
    obj = {
        "commitlogOffset": snapshot.commitlog_offset,
        "flushedOffset": snapshot.flushed_offset,
        "queueOffsets": {f"{t}-{q}": n for (t, q), n in sorted(snapshot.next_offsets.items())},
    }
    write_json_atomically(store_dir / SNAPSHOT_FILE, obj)


def read_snapshot(store_dir: Path) -> Snapshot | None:
    """The snapshot (or its ``.bak``), or None when absent or unusable (logged)."""
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


def abort_file_exists(store_dir: Path) -> bool:
    return (store_dir / ABORT_FILE).exists()


def tail_marks(abnormal: bool, snapshot: Snapshot | None) -> TailMarks:
    """The durable offset the snapshot recorded (0 without one), and whether the last
    process crashed (``abnormal``: the abort file is there)."""
    return TailMarks(snapshot.flushed_offset if snapshot is not None else 0, abnormal)


def read_tail_marks(store_dir: Path) -> TailMarks:
    """:func:`tail_marks` from the files of ``store_dir`` (the offline tools)."""
    return tail_marks(abort_file_exists(store_dir), read_snapshot(store_dir))

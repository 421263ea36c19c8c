"""A batch of records ready for the append lock: one buffer and what the lock needs.

Both ways into the store end here: messages encoded by the store's codec
(:func:`run_from_records`) and runs encoded by a producer-side writer and checked by the
store (:mod:`services.storage.engine.run_check`). Under the lock the commitlog only
assigns offsets, patches three fields per record in ``data`` and copies ``data`` into
the segment with one slice assignment per segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tide.format import SYSFLAG_TRANSACTION_MASK, EncodedRecord, is_queue_less

# (topic, queue_id) of a record that takes a queue offset; None for one that does not
# (transaction prepared / rollback).
QueueKey = tuple[str, int] | None


@dataclass(slots=True)
class RecordRun:
    data: bytearray  # whole records back to back; lock-time fields zero
    sizes: list[int]  # each record's size, in order
    queue_keys: list[QueueKey]
    store_timestamp_positions: list[int]  # inside each record (56, or 68: IPv6 born host)

    def __post_init__(self) -> None:
        count = len(self.sizes)
        assert len(self.queue_keys) == count == len(self.store_timestamp_positions)


def queue_key(topic: str, queue_id: int, sys_flag: int) -> QueueKey:
    if sys_flag & SYSFLAG_TRANSACTION_MASK and is_queue_less(sys_flag):
        return None
    return (topic, queue_id)


def run_from_records(records: Sequence[EncodedRecord]) -> RecordRun:
    """The run of records encoded one by one (the store's codec)."""
    data = bytearray().join([record.data for record in records])
    sizes = [len(record.data) for record in records]
    keys = [queue_key(record.topic, record.queue_id, record.sys_flag) for record in records]
    positions = [record.store_timestamp_pos for record in records]
    assert sum(sizes) == len(data)
    return RecordRun(data, sizes, keys, positions)

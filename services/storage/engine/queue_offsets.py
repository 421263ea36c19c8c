"""The (topic, queue_id) -> next queue offset table.

Queue offsets are assigned at append time. So that a restart does not rescan the whole
commitlog, the table is snapshotted (``queue_offsets.json`` in the store root, Tide's
own file: ``tide.format.Snapshot``) together with the commitlog offset it is consistent
with. Recovery loads the snapshot and replays the records after that offset. Replay is
idempotent: a record sets its queue's next offset to ``max(current, queue_offset + 1)``.
"""

from __future__ import annotations

QueueKey = tuple[str, int]


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


__all__ = ["QueueOffsetTable"]

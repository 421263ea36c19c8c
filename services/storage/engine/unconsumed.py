"""Which consumer groups lose messages they had not consumed when retention deletes
segments by force (disk pressure), as RocketMQ deletes them regardless.

The messages of a queue a deletion takes are a range of queue offsets ``[first, end)``:
the queue offset table as the first record went into the first deleted segment, and as
it went into the first segment kept (the commitlog records both, once per segment). A
segment written before this process started has no such record: its records are
scanned instead (a forced deletion is rare). A group that committed offset ``c`` in the
queue had not consumed ``end - max(c, first)`` of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from services.storage.engine.queue_offsets import QueueKey
from tide.format import ScanKind, is_queue_less, scan_record
from tide.mapped import MappedFile

MAX_NAMED = 10  # (topic, group) pairs named in one warning; the rest are counted

QueueRanges = dict[QueueKey, tuple[int, int]]


@dataclass
class UnconsumedReport:
    messages: int = 0
    # (topic, group) -> messages deleted past the group's committed offset
    by_group: dict[tuple[str, str], int] = field(default_factory=dict)

    def describe(self) -> str:
        pairs = sorted(self.by_group.items(), key=lambda item: (-item[1], item[0]))
        named = pairs[:MAX_NAMED]
        text = ", ".join(f"topic {t!r} group {g!r}: {count}" for (t, g), count in named)
        if len(pairs) > MAX_NAMED:
            text += f", and {len(pairs) - MAX_NAMED} more (topic, group) pairs"
        return text


def deleted_queue_ranges(
    removed: Sequence[MappedFile],
    at_first: Mapping[QueueKey, int] | None,
    at_end: Mapping[QueueKey, int] | None,
) -> QueueRanges:
    """Per queue, the queue offsets ``[first, end)`` the ``removed`` segments held."""
    if at_first is not None and at_end is not None:
        ranges: QueueRanges = {}
        for key, end in at_end.items():
            first = at_first.get(key, 0)
            if end > first:
                ranges[key] = (first, end)
        return ranges
    return _scan(removed)


def _scan(removed: Sequence[MappedFile]) -> QueueRanges:
    ranges: QueueRanges = {}
    for segment in removed:
        pos, size = 0, segment.size_bytes
        while True:
            scan = scan_record(
                segment.mm, pos, size, expected_offset=segment.start_offset + pos, check_crc=False
            )
            if scan.kind is not ScanKind.RECORD:
                break  # the blank marker, the end, or nothing readable
            if not is_queue_less(scan.sys_flag):
                key = (scan.topic, scan.queue_id)
                first, end = ranges.get(key, (scan.queue_offset, scan.queue_offset + 1))
                ranges[key] = (min(first, scan.queue_offset), max(end, scan.queue_offset + 1))
            pos += scan.size
    return ranges


def unconsumed_report(
    ranges: QueueRanges, committed: Mapping[tuple[str, str], Mapping[int, int]]
) -> UnconsumedReport:
    """``committed``: (topic, group) -> {queue id: committed offset}."""
    report = UnconsumedReport()
    for (topic, group), queues in committed.items():
        lost = 0
        for queue_id, offset in queues.items():
            deleted = ranges.get((topic, queue_id))
            if deleted is not None:
                first, end = deleted
                lost += max(0, end - max(offset, first))
        if lost:
            report.by_group[(topic, group)] = lost
            report.messages += lost
    return report

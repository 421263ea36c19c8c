"""Recovery at start: find the end of the valid commitlog and rebuild the queue offsets.

* Normal (no ``abort`` file, the last close was clean): verify from the third-to-last
  segment.
* Abnormal (``abort`` file left behind): start from the newest segment whose first record
  was stored at least 3 s before the checkpoint's time (that segment was flushed whole),
  verifying every record's CRC.

The scan stops at the first place that is not a valid record. An invalid record after
which nothing valid follows is a *torn tail*, the normal result of a crash: a clean end.
After a crash, invalid bytes at or past the durable offset the store last recorded are a
torn tail even when valid records follow: the write the crash interrupted, which lands
in any order (``tide.format.TailMarks``). Invalid bytes followed by valid data after a
clean close, or below the durable offset, are *corruption*: reported in the log and in
the store status, and the log is cut there as RocketMQ does. The caller truncates at the
returned end offset.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from services.storage.engine.queue_offsets import QueueOffsetTable
from tide.format import (
    Checkpoint,
    ScanKind,
    Snapshot,
    TailMarks,
    find_data_after,
    replay_records,
    scan_record,
    tail_marks,
)
from tide.mapped import MappedFile

log = logging.getLogger("tide.storage.recovery")
CHECKPOINT_SAFETY_MS = 3_000
NORMAL_RECOVERY_SEGMENTS = 3


@dataclass
class RecoveryReport:
    mode: str  # "normal" or "abnormal"
    start_offset: int = 0
    end_offset: int = 0
    records_scanned: int = 0
    torn_tail_offset: int | None = None
    # Where valid data follows the torn tail's first bad byte (a write the crash
    # interrupted landed out of order); cut with the rest of the tail.
    torn_tail_data_after: int | None = None
    corruption: list[str] = field(default_factory=list)
    snapshot_used: bool = False

    def summary(self) -> str:
        text = f"{self.mode} recovery: verified {self.records_scanned} records from offset "
        text += f"{self.start_offset}, valid end {self.end_offset}"
        if self.torn_tail_offset is not None:
            text += f", torn tail at {self.torn_tail_offset}"
        if self.torn_tail_data_after is not None:
            text += f" (an interrupted write; its data at {self.torn_tail_data_after} is cut)"
        if self.corruption:
            text += f", CORRUPTION: {'; '.join(self.corruption)}"
        return text


def recover(
    segments: list[MappedFile],
    *,
    abnormal: bool,
    checkpoint: Checkpoint,
    snapshot: Snapshot | None,
    table: QueueOffsetTable,
) -> RecoveryReport:
    """Scan, fill ``table``, set the positions of the segments before the end, and return
    the report (its ``end_offset`` is where the caller truncates)."""
    report = RecoveryReport("abnormal" if abnormal else "normal")
    if not segments:
        return report
    start = _abnormal_start(segments, checkpoint) if abnormal else _normal_start(segments)
    report.start_offset = segments[start].start_offset
    scanned = QueueOffsetTable()
    marks = tail_marks(abnormal, snapshot)
    report.end_offset = _scan(segments, start, scanned, report, marks)
    for segment in segments:
        if segment.end_offset <= report.end_offset:
            segment.set_positions(segment.size_bytes)
    _rebuild_offsets(segments, report, snapshot, scanned, table)
    log.log(logging.ERROR if report.corruption else logging.INFO, "%s", report.summary())
    return report


def _normal_start(segments: list[MappedFile]) -> int:
    return max(0, len(segments) - NORMAL_RECOVERY_SEGMENTS)


def _abnormal_start(segments: list[MappedFile], checkpoint: Checkpoint) -> int:
    trusted_ms = (
        min(checkpoint.physic_msg_timestamp_ms, checkpoint.logics_msg_timestamp_ms)
        - CHECKPOINT_SAFETY_MS
    )
    for index in range(len(segments) - 1, -1, -1):
        first = scan_record(segments[index].mm, 0, segments[index].size_bytes, check_crc=False)
        if first.kind is ScanKind.RECORD and 0 < first.store_timestamp_ms <= trusted_ms:
            log.info("abnormal recovery starts at segment %s", segments[index].path.name)
            return index
    return 0


def _scan(
    segments: list[MappedFile],
    start: int,
    table: QueueOffsetTable,
    report: RecoveryReport,
    marks: TailMarks,
) -> int:
    """Verify records from ``segments[start]``; return the end of the valid prefix."""
    for index in range(start, len(segments)):
        segment = segments[index]
        mm, size, base = segment.mm, segment.size_bytes, segment.start_offset
        # Every record up to the first unit that is not one, at once (compiled core);
        # scan_record then says what that unit is.
        pos, records = replay_records(mm, 0, size, base, table.next_offsets)
        report.records_scanned += records
        scan = scan_record(mm, pos, size, expected_offset=base + pos)
        assert scan.kind is not ScanKind.RECORD, (base + pos, scan)
        if scan.kind is not ScanKind.BLANK:  # a blank: the segment ends, on to the next
            _classify_stop(segments, index, pos, scan.reason, report, marks)
            return base + pos
        if index == len(segments) - 1:
            return segment.end_offset
    return segments[-1].end_offset


def _classify_stop(
    segments: list[MappedFile],
    index: int,
    pos: int,
    reason: str,
    report: RecoveryReport,
    marks: TailMarks,
) -> None:
    """``reason`` empty: zeros, nothing written there."""
    offset = segments[index].start_offset + pos
    what, durable = reason or "no record (zeros)", marks.durable_offset
    later = _later_data(segments, index, pos)
    if marks.is_corruption(offset, later is not None):
        if offset < durable:
            where = f", and {later[1]}" if later is not None else ""
            text = f"{what} at offset {offset}, below the durable offset {durable}{where}"
        else:
            assert later is not None
            text = f"{what} at offset {offset}, but {later[1]}: "
            text += f"{later[0] - offset} bytes and everything after are cut off"
        report.corruption.append(text)
    elif later is not None:
        report.torn_tail_offset = offset
        report.torn_tail_data_after = later[0]
        log.warning(
            "torn tail at offset %d (%s), then %s: the write the crash interrupted, at or past "
            "the durable offset %d; cut",
            offset,
            what,
            later[1],
            durable,
        )
    elif reason:
        report.torn_tail_offset = offset
        log.info("torn tail at offset %d (%s): a clean end after a crash", offset, what)


def _later_data(segments: list[MappedFile], index: int, pos: int) -> tuple[int, str] | None:
    """Valid data after ``pos``: in this segment, or any non-zero byte in a later one
    (the rule ``tide store verify`` applies too)."""
    segment = segments[index]
    found = find_data_after(segment.mm, pos, segment.size_bytes, segment.start_offset)
    if found is not None:
        return segment.start_offset + found[0], found[1]
    for later in segments[index + 1 :]:
        if later.data_extent():
            return later.start_offset, f"segment {later.path.name} holds data"
    return None


def _rebuild_offsets(
    segments: list[MappedFile],
    report: RecoveryReport,
    snapshot: Snapshot | None,
    scanned: QueueOffsetTable,
    table: QueueOffsetTable,
) -> None:
    """table = snapshot + replay of what follows it (or a scan from the min offset)."""
    min_offset = segments[0].start_offset
    usable = snapshot is not None and min_offset <= snapshot.commitlog_offset <= report.end_offset
    if usable:
        assert snapshot is not None
        table.next_offsets = dict(snapshot.next_offsets)
        replay_from = snapshot.commitlog_offset
        report.snapshot_used = True
    else:
        if snapshot is not None:
            log.warning(
                "queue offset snapshot at %d is outside [%d, %d]; scanning from the min offset",
                snapshot.commitlog_offset,
                min_offset,
                report.end_offset,
            )
        replay_from = min_offset
    if replay_from < report.start_offset:
        _replay_range(segments, replay_from, report.start_offset, table)
    for key, next_offset in scanned.next_offsets.items():
        table.replay(key[0], key[1], next_offset - 1)


def _replay_range(
    segments: list[MappedFile], begin: int, end: int, table: QueueOffsetTable
) -> None:
    """Replay queue offsets of records in [begin, end) without CRC checks."""
    offset = begin
    first = segments[0].start_offset
    size = segments[0].size_bytes
    while offset < end:
        segment = segments[(offset - first) // size]
        pos = offset - segment.start_offset
        limit = min(size, end - segment.start_offset)  # (end: a segment's start)
        stop, _ = replay_records(
            segment.mm, pos, limit, segment.start_offset, table.next_offsets, check_crc=False
        )
        offset += stop - pos
        if stop > pos:
            continue
        scan = scan_record(segment.mm, pos, size, expected_offset=offset, check_crc=False)
        if scan.kind is ScanKind.BLANK:
            offset = segment.end_offset
        else:
            log.warning("replaying queue offsets stopped at %d: %s", offset, scan.reason)
            return

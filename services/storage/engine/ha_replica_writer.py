"""The slave's side of replication: write the master's commitlog bytes at the same offsets.

Chunks arrive contiguous and never cross a segment end; each is copied into the segment
holding its offset (created like the master's: same name, same size, rolled when the
previous one is full). Only whole records are published (``wrote``/``committed``): a
record cut by a chunk end waits for the rest, so readers, the flush, the queue offset
snapshot and the acks always see a record boundary. Every published record is replayed
into the queue offset table (no CRC check: the master checked its bytes), and its store
timestamp drives the checkpoint, so the slave's own flush, checkpoint and recovery work
exactly as a master's. A segment's blank marker is copied with its filler; the segment is
published full once the filler is in.
"""

from __future__ import annotations

import logging
import zlib

from services.storage.engine.message_store import MessageStore
from services.storage.engine.queue_offsets import QueueOffsetTable
from tide.format import (
    BLANK_MAGIC,
    BLANK_MARKER_BYTES,
    RECORD_HEAD,
    ScanKind,
    Snapshot,
    is_queue_less,
    scan_record,
    segment_name,
    write_snapshot,
)
from tide.mapped import MappedFile

log = logging.getLogger("tide.storage.replica")
TAIL_CHECK_BYTES = 4096
_HEADER = RECORD_HEAD  # total_size, magic


class ReplicationError(Exception):
    """The master's stream cannot be applied here (the message says why and what to do)."""


def tail_range(max_offset: int, segment_size_bytes: int) -> int:
    """Start of the tail-check range [start, max_offset): at most 4 KiB, in one segment."""
    if max_offset <= 0:
        return max_offset
    segment_start = (max_offset - 1) // segment_size_bytes * segment_size_bytes
    return max(segment_start, max_offset - TAIL_CHECK_BYTES)


class ReplicaWriter:
    def __init__(self, store: MessageStore) -> None:
        if store.pool is not None:
            raise ValueError("a slave cannot use the write buffer pool")
        self._store = store
        self._commitlog = store.commitlog
        self._segments = store.segments
        self._next_offset = -1  # the next byte the stream must deliver

    @property
    def max_offset(self) -> int:
        """Everything below it is written, in whole records (what the slave acks)."""
        return self._segments.max_offset

    def tail_check(self) -> tuple[int, int]:
        """(start, CRC-32 of the bytes [start, max offset)) for the hello."""
        with self._commitlog.lock:
            end = self._segments.max_offset
            start = max(tail_range(end, self._segments.size_bytes), self._segments.min_offset)
            if start >= end:
                return end, 0
            segment = self._segments.find(start)
            assert segment is not None, start
            pos = start - segment.start_offset
            return start, zlib.crc32(segment.read(pos, end - start))

    def begin(self, start_offset: int, master_address: str) -> None:
        """The master's stream starts at ``start_offset``: truncate to it when this slave
        holds more; refuse when it holds less than the master could continue from."""
        with self._commitlog.lock:
            own_min, own_max = self._segments.min_offset, self._segments.max_offset
            if start_offset > own_max:
                raise ReplicationError(
                    f"this slave's commitlog ends at {own_max}, below the min offset "
                    f"{start_offset} its master {master_address} still holds (retention "
                    "deleted the rest): stop this storage, empty its --store-dir and start "
                    "it again to copy the master's commitlog from its min offset"
                )
            if start_offset < own_max:
                if start_offset < own_min:
                    raise ReplicationError(
                        f"the master {master_address} ends at {start_offset}, below this "
                        f"slave's min offset {own_min}: empty this slave's --store-dir"
                    )
                log.warning(
                    "this slave holds bytes its master %s does not: truncating the commitlog "
                    "from its max offset %d to the master's max offset %d",
                    master_address,
                    own_max,
                    start_offset,
                )
                self._truncate_locked(start_offset)
            self._next_offset = start_offset

    def _truncate_locked(self, offset: int) -> None:
        segments = self._segments
        segments.truncate(offset)
        table = QueueOffsetTable()
        _replay(segments.segments, segments.min_offset, offset, table)
        self._commitlog.offsets.next_offsets = table.next_offsets
        self._store.checkpoint_service.discard_pending()
        for segment in segments.segments:
            if segment.end_offset > offset:
                segment.sync()
        write_snapshot(self._store.config.store_dir, Snapshot(offset, offset, table.next_offsets))

    def write(self, offset: int, data: bytes) -> int:
        """Copy a chunk; returns the new max offset (whole records written)."""
        if offset != self._next_offset:
            raise ReplicationError(
                f"the master sent a chunk at offset {offset}; the stream was at "
                f"{self._next_offset}: chunks must be contiguous"
            )
        commitlog = self._commitlog
        with commitlog.lock:
            segment = self._segment_for(offset)
            pos = offset - segment.start_offset
            end = pos + len(data)
            if end > segment.size_bytes:
                raise ReplicationError(
                    f"the chunk at {offset} ({len(data)} bytes) crosses the end of segment "
                    f"{segment_name(segment.start_offset)}"
                )
            segment.mm[pos:end] = data
            published, timestamp_ms = self._scan(segment, end)
            if published > segment.wrote:  # (a blank + filler alone keeps the time)
                timestamp_ms = timestamp_ms or segment.last_store_timestamp_ms
                commitlog.publish_replicated(segment, published, timestamp_ms)
            max_offset = self._segments.max_offset
        self._next_offset = offset + len(data)
        group_commit = self._store.group_commit
        if group_commit is not None:  # SYNC_FLUSH: flush soon (the ack does not wait for it)
            group_commit.request(max_offset)
        commitlog.notify_listeners(max_offset)
        return max_offset

    def _segment_for(self, offset: int) -> MappedFile:
        segment = self._segments.find(offset)
        if segment is not None:
            return segment
        if offset != self._segments.max_offset or offset % self._segments.size_bytes:
            raise ReplicationError(
                f"no segment holds offset {offset} and it does not start the next one "
                f"(max offset {self._segments.max_offset})"
            )
        return self._commitlog.writable_segment()  # created like the master's

    def _scan(self, segment: MappedFile, received_end: int) -> tuple[int, int]:
        """From the published end to the last whole record (or blank + filler) within
        ``received_end``; replays queue offsets. Returns (position, last store time)."""
        mm, size, base = segment.mm, segment.size_bytes, segment.start_offset
        replay = self._commitlog.offsets.replay
        pos, timestamp_ms = segment.wrote, 0
        while received_end - pos >= BLANK_MARKER_BYTES:
            total_size, magic = _HEADER.unpack_from(mm, pos)
            if magic == BLANK_MAGIC:
                if total_size != size - pos:
                    raise ReplicationError(
                        f"blank marker at {base + pos} says {total_size} bytes left; the "
                        f"segment has {size - pos}"
                    )
                if received_end < size:
                    break  # the filler is still coming
                segment.blank_position = pos
                return size, timestamp_ms
            if pos + total_size > received_end and 0 < total_size <= size - pos:
                break  # the rest of this record is in the next chunk
            scan = scan_record(mm, pos, received_end, expected_offset=base + pos, check_crc=False)
            if scan.kind is not ScanKind.RECORD:
                raise ReplicationError(
                    f"the master's bytes at {base + pos} are not a record ({scan.reason}); "
                    "is the master's commitlog corrupt? run tide store verify on it"
                )
            if not is_queue_less(scan.sys_flag):
                replay(scan.topic, scan.queue_id, scan.queue_offset)
            timestamp_ms = scan.store_timestamp_ms
            pos += scan.size
        return pos, timestamp_ms


def _replay(segments: list[MappedFile], begin: int, end: int, table: QueueOffsetTable) -> None:
    """Queue offsets of the records in [begin, end) (after a truncation)."""
    offset = begin
    while segments and offset < end:
        segment = segments[(offset - segments[0].start_offset) // segments[0].size_bytes]
        pos = offset - segment.start_offset
        scan = scan_record(
            segment.mm, pos, segment.size_bytes, expected_offset=offset, check_crc=False
        )
        if scan.kind is ScanKind.RECORD:
            if not is_queue_less(scan.sys_flag):
                table.replay(scan.topic, scan.queue_id, scan.queue_offset)
            offset += scan.size
        elif scan.kind is ScanKind.BLANK:
            offset = segment.end_offset
        else:
            raise ReplicationError(
                f"rebuilding queue offsets after the truncation stopped at {offset}: "
                f"{scan.reason or 'no record'}"
            )


__all__ = ["ReplicaWriter", "ReplicationError", "tail_range"]

"""SegmentQueue: the ordered segments of the commitlog (RocketMQ's MappedFileQueue).

The list of segments is replaced, never mutated in place, so readers can take a
snapshot without a lock; changes happen under ``self._lock``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from services.storage.engine.allocator import SegmentAllocator
from services.storage.engine.errors import CorruptStoreError
from services.storage.engine.segment_files import remove_leftover_allocations
from tide.format import parse_segment_name, segment_name
from tide.mapped import MappedFile

log = logging.getLogger("tide.storage.segment_queue")


class SegmentQueue:
    def __init__(self, directory: Path, size_bytes: int, allocator: SegmentAllocator) -> None:
        self.directory = directory
        self.size_bytes = size_bytes
        self._allocator = allocator
        self._lock = threading.Lock()
        self.segments: list[MappedFile] = []
        # attr -> start offset of the oldest segment not yet settled for it
        self._cursor: dict[str, int] = {}
        # Metrics: called after a flush pass that synced data with (seconds, segments synced).
        self.flush_observer: Callable[[float, int], None] | None = None

    # -- loading -----------------------------------------------------------------
    def load(self) -> None:
        """Map every segment in the directory; refuse a broken chain."""
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_leftover_allocations(self.directory)
        found: list[tuple[int, Path]] = []
        for path in self.directory.iterdir():
            start = parse_segment_name(path.name)
            if start is None:
                log.warning("ignoring %s: not a segment file", path)
                continue
            found.append((start, path))
        found.sort()
        segments = []
        for index, (start, path) in enumerate(found):
            if start % self.size_bytes:
                raise CorruptStoreError(
                    f"{path.name}: start offset is not a multiple of the segment size "
                    f"{self.size_bytes}; was the store written with another --segment-size-bytes?"
                )
            if index and start != found[index - 1][0] + self.size_bytes:
                raise CorruptStoreError(
                    f"gap in the commitlog: {found[index - 1][1].name} is followed by {path.name}"
                )
            try:
                segments.append(MappedFile(path, start, self.size_bytes))
            except ValueError as exc:
                raise CorruptStoreError(f"{exc}; check --segment-size-bytes") from None
        self.segments = segments
        log.info("loaded %d segment(s) from %s", len(segments), self.directory)

    # -- lookup ------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        segments = self.segments
        return segments[0].start_offset if segments else 0

    @property
    def max_offset(self) -> int:
        """End of the last written byte (segments created ahead and still empty do not
        count)."""
        segments = self.segments
        for segment in reversed(segments):
            if segment.wrote:
                return segment.start_offset + segment.wrote
        return segments[0].start_offset if segments else 0

    @property
    def committed_offset(self) -> int:
        """End of the readable prefix."""
        for segment in self._unsettled("committed"):
            return segment.start_offset + segment.committed
        last = self.last()
        return last.end_offset if last else 0

    @property
    def flushed_offset(self) -> int:
        """End of the durable prefix: the first segment not flushed to its end decides."""
        for segment in self._unsettled("flushed"):
            return segment.start_offset + segment.flushed
        last = self.last()
        return last.end_offset if last else 0

    def _unsettled(self, attr: str) -> list[MappedFile]:
        """Segments, oldest first, from the oldest whose ``attr`` position ("committed" or
        "flushed") is short of its end. Positions only grow, so the search resumes from
        where the previous one found that segment (RocketMQ keeps one such cursor)."""
        segments = self.segments
        if not segments:
            return []
        first_start = segments[0].start_offset
        index = max(0, (self._cursor.get(attr, first_start) - first_start) // self.size_bytes)
        while index < len(segments) and getattr(segments[index], attr) == self.size_bytes:
            index += 1
        if index < len(segments):
            self._cursor[attr] = segments[index].start_offset
        return segments[index:]

    def find(self, offset: int) -> MappedFile | None:
        """The segment holding ``offset``, or None."""
        segments = self.segments
        if not segments:
            return None
        index = (offset - segments[0].start_offset) // self.size_bytes
        if 0 <= index < len(segments):
            segment = segments[index]
            assert segment.start_offset <= offset < segment.end_offset
            return segment
        return None

    def last(self) -> MappedFile | None:
        segments = self.segments
        return segments[-1] if segments else None

    # -- growth and shrinkage ----------------------------------------------------
    def next_segment(self, start_offset: int) -> MappedFile:
        """Append the segment starting at ``start_offset`` (from the allocator)."""
        assert start_offset % self.size_bytes == 0, start_offset
        last = self.last()
        assert last is None or last.end_offset == start_offset, (last, start_offset)
        segment = self._allocator.get(start_offset)
        with self._lock:
            self.segments = [*self.segments, segment]
        return segment

    def truncate(self, offset: int) -> int:
        """Drop everything at and after ``offset`` (recovery). Returns bytes dropped.

        RocketMQ's truncateDirtyFiles: segments starting past ``offset`` are deleted, the
        one holding it is cut at it (and zeroed from there)."""
        dropped = 0
        keep: list[MappedFile] = []
        for segment in self.segments:
            if segment.start_offset > offset:
                dropped += segment.data_extent()
                log.info("deleting segment %s past offset %d", segment.path.name, offset)
                segment.close(unlink=True)
                continue
            if offset < segment.end_offset:
                position = offset - segment.start_offset
                dropped += segment.zero_from(position)
                segment.set_positions(position)
            keep.append(segment)
        with self._lock:
            self.segments = keep
            self._cursor.clear()  # positions went back
        return dropped

    def remove_first(self, count: int) -> list[MappedFile]:
        """Detach the ``count`` oldest segments (retention); never the last one."""
        with self._lock:
            count = min(count, len(self.segments) - 1)
            if count <= 0:
                return []
            removed, self.segments = self.segments[:count], self.segments[count:]
        return removed

    # -- commit and flush ----------------------------------------------------------
    def commit(self, least_pages: int) -> bool:
        did = False
        for segment in self._unsettled("committed"):
            if segment.committed < segment.wrote:
                did = segment.commit(least_pages) or did
        return did

    def flush(self, least_pages: int) -> bool:
        started = time.perf_counter()
        synced = 0
        for segment in self._unsettled("flushed"):
            if segment.flushed < segment.committed and segment.flush(least_pages):
                synced += 1
        observer = self.flush_observer
        if synced and observer is not None:
            observer(time.perf_counter() - started, synced)
        return synced > 0

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        self.segments = []

    def describe(self) -> str:
        return ", ".join(segment_name(s.start_offset) for s in self.segments)

"""The timer's two files: the wheel (one mapped file of slots) and the log (mapped segments
of 52-byte units), RocketMQ 5's ``timerwheel`` and ``timerlog/`` (docs/formats.md, "Timer
wheel" and "Timer log"; the byte layouts are tide.format's).

Nothing per timer lives in memory: a slot is read from the mapping when it is needed, a
unit likewise. The log is appended at its end only; recovery cuts it (``truncate``) at the
checkpoint's durable offset.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from tide.files import allocate_file
from tide.format import (
    DEFAULT_TIMER_LOG_SEGMENT_BYTES,
    TIMER_LOG_BLANK_BYTES,
    TIMER_LOG_UNIT_BYTES,
    TimerLogScan,
    TimerLogUnit,
    TimerSlot,
    TimerWheelGeometry,
    iter_timer_slots,
    iter_unit_times,
    pack_timer_blank,
    pack_timer_unit,
    parse_segment_name,
    put_wheel_slot,
    read_wheel_slot,
    scan_timer_log_segment,
    segment_name,
    timer_unit_error,
    timer_unit_fits,
    unpack_timer_unit,
    wheel_file_error,
)
from tide.mapped import reads_through_file


def _last_slot_ms(mm: mmap.mmap) -> int:
    """The latest slot time of a segment's units (a unit's size field is 52; the scan
    stops at the first that is not: the blank, or zeros)."""
    last = -1
    usable = len(mm) - len(mm) % TIMER_LOG_UNIT_BYTES
    view = memoryview(mm)[:usable]
    try:
        for size, enqueue_ms, delay_ms in iter_unit_times(view):
            if size != TIMER_LOG_UNIT_BYTES:
                break
            last = max(last, enqueue_ms + delay_ms)
    finally:
        view.release()
    return last


class TimerFileError(Exception):
    """A timer file cannot be used as it is (its message says which and why)."""


def _map(path: Path, size_bytes: int) -> tuple[int, mmap.mmap]:
    """Map a file of exactly ``size_bytes``, created with its blocks reserved when it is
    new (a full disk fails here with OSError, not as SIGBUS on a write to the mapping)."""
    if not path.exists() or path.stat().st_size == 0:
        tmp = path.with_name(path.name + ".tmp")
        allocate_file(tmp, size_bytes)
        os.replace(tmp, path)
    fd = os.open(path, os.O_RDWR)
    try:
        return fd, mmap.mmap(fd, size_bytes, flags=mmap.MAP_SHARED)
    except BaseException:
        os.close(fd)
        raise


class TimerWheel:
    """``<store_dir>/timerwheel``: 2 * slots_total slots of 32 bytes, mapped whole."""

    def __init__(self, path: Path, geometry: TimerWheelGeometry) -> None:
        self.path = path
        self.geometry = geometry
        size = path.stat().st_size if path.exists() else 0
        error = wheel_file_error(geometry, size)
        if error is not None:
            raise TimerFileError(f"{path}: {error}")
        self._fd, self.mm = _map(path, geometry.file_bytes)

    def slot(self, time_ms: int) -> TimerSlot:
        """The slot of ``time_ms`` (EMPTY_SLOT when it holds another lap's time)."""
        return read_wheel_slot(self.geometry, self.mm, time_ms)

    def add_unit(self, slot_time_ms: int, position: int) -> TimerSlot:
        """Record that the unit at ``position`` (written with the slot's old last_pos as
        its prev_pos) is the slot's newest."""
        old = self.slot(slot_time_ms)
        empty = old.last_pos < 0
        first = position if empty else old.first_pos
        slot = TimerSlot(slot_time_ms, first, position, (0 if empty else old.num) + 1)
        put_wheel_slot(self.geometry, self.mm, slot)
        return slot

    def live_slots(self, start_ms: int) -> Iterator[TimerSlot]:
        """The non-empty slots of the lap that starts at ``start_ms``, in file order (one
        pass over the mapping, unpacked in C: recovery and the pending count)."""
        geometry = self.geometry
        step = geometry.precision_ms
        first_index = geometry.slot_index(start_ms)
        start_units = start_ms // step
        lap = geometry.wheel_slots
        view = memoryview(self.mm)[: geometry.file_bytes]
        try:
            for index, (stored, first, last, num, magic) in enumerate(iter_timer_slots(view)):
                if last >= 0 and stored == start_units + (index - first_index) % lap:
                    yield TimerSlot(stored * step, first, last, num, magic)
        finally:
            view.release()

    def put(self, slot: TimerSlot) -> None:
        put_wheel_slot(self.geometry, self.mm, slot)

    def flush(self) -> None:
        os.fdatasync(self._fd)  # releases the GIL; covers writes through the mapping

    def close(self) -> None:
        self.mm.close()
        os.close(self._fd)


class _Segment:
    def __init__(self, path: Path, start: int, size_bytes: int) -> None:
        self.start = start
        self.path = path
        self.fd, self.mm = _map(path, size_bytes)
        # The latest slot time of the units in it: once the wheel fired past it, no slot
        # still to fire names a unit here (one int per segment, never per unit).
        self.last_slot_ms = _last_slot_ms(self.mm)

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class TimerLog:
    """``<store_dir>/timerlog/``: segments named by their 20-digit start offset.

    ``end`` is where the next unit goes. Only segments are held open (a 100 MiB segment
    holds ~2 million units), never units.
    """

    def __init__(
        self, directory: Path, segment_bytes: int = DEFAULT_TIMER_LOG_SEGMENT_BYTES
    ) -> None:
        if segment_bytes < TIMER_LOG_UNIT_BYTES + TIMER_LOG_BLANK_BYTES:
            raise ValueError(f"timer log segment of {segment_bytes} bytes is too small")
        self.directory = directory
        self.segment_bytes = segment_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self._segments: list[_Segment] = []
        for path in sorted(directory.iterdir()):
            start = parse_segment_name(path.name)
            if start is None:
                continue
            if path.stat().st_size != segment_bytes:
                raise TimerFileError(
                    f"{path} is {path.stat().st_size} bytes; timer log segments are {segment_bytes}"
                )
            self._segments.append(_Segment(path, start, segment_bytes))
        self.end = 0
        self._flushed_segments = 0  # segments below this index are synced and full

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def scan(self, durable_offset: int) -> TimerLogScan | None:
        """Scan the segment holding ``durable_offset`` (or the last one): recovery's
        check of the log (None: the log is empty)."""
        if not self._segments:
            return None
        segment = self._segment_at(durable_offset) or self._segments[-1]
        return scan_timer_log_segment(segment.mm, segment.start, durable_offset, self.segment_bytes)

    def truncate(self, end: int) -> None:
        """Make ``end`` the log's end: zero what follows in its segment, delete later
        segments (recovery; a cut unit must not be taken for a unit after a later crash)."""
        kept: list[_Segment] = []
        for segment in self._segments:
            if segment.start >= end:
                segment.close()
                segment.path.unlink(missing_ok=True)
                continue
            kept.append(segment)
        self._segments = kept
        last = self._segment_at(end)
        if last is not None:
            position = end - last.start
            last.mm[position:] = bytes(self.segment_bytes - position)
            os.fdatasync(last.fd)
        self.end = end
        self._flushed_segments = max(0, len(self._segments) - 1)

    def append(self, unit: TimerLogUnit) -> int:
        """Write ``unit`` at the end (starting a segment when it does not fit); its offset."""
        segment = self._segment_at(self.end)
        if segment is not None and not timer_unit_fits(
            segment.start + self.segment_bytes - self.end
        ):
            position = self.end - segment.start
            blank = pack_timer_blank(self.segment_bytes - position)
            segment.mm[position : position + len(blank)] = blank
            self.end = segment.start + self.segment_bytes
            segment = None
        if segment is None:
            segment = self._new_segment(self.end)
        offset = self.end
        position = offset - segment.start
        segment.mm[position : position + TIMER_LOG_UNIT_BYTES] = pack_timer_unit(unit)
        segment.last_slot_ms = max(segment.last_slot_ms, unit.delayed_time_ms)
        self.end = offset + TIMER_LOG_UNIT_BYTES
        return offset

    def read_checked(self, offset: int) -> TimerLogUnit | None:
        """The unit at ``offset``, None when the bytes there are not one (a blank)."""
        segment = self._segment_at(offset)
        if segment is None:
            return None
        position = offset - segment.start
        if timer_unit_error(segment.mm, position, offset) is not None:
            return None
        return unpack_timer_unit(segment.mm, position)

    def read(self, offset: int) -> TimerLogUnit:
        """The unit at ``offset``: from the mapping, or with ``pread`` on a thread marked
        by tide.mapped.read_through_file (a slot's chain, walked off the event loop: its
        units were written whenever their timers were set, maybe hours ago and no longer
        in memory; the GIL is free while the disk answers)."""
        segment = self._segment_at(offset)
        if segment is None or offset + TIMER_LOG_UNIT_BYTES > self.end:
            raise TimerFileError(f"no timer log unit at {offset} (the log ends at {self.end})")
        position = offset - segment.start
        if reads_through_file():
            return unpack_timer_unit(os.pread(segment.fd, TIMER_LOG_UNIT_BYTES, position))
        return unpack_timer_unit(segment.mm, position)

    def flush(self) -> None:
        """fdatasync every segment written since the last flush."""
        last = len(self._segments) - 1
        for index in range(self._flushed_segments, last + 1):
            os.fdatasync(self._segments[index].fd)
        self._flushed_segments = max(self._flushed_segments, last)

    def delete_fired(self, fired_before_ms: int) -> int:
        """Delete the oldest segments (never the one written to) whose every unit is in a
        slot before ``fired_before_ms`` (the checkpoint's read time: recovery starts there,
        and a slot from it on only names units of its own time); how many."""
        deleted = 0
        while len(self._segments) > 1 and self._segments[0].last_slot_ms < fired_before_ms:
            segment = self._segments.pop(0)
            segment.close()
            segment.path.unlink(missing_ok=True)
            self._flushed_segments = max(0, self._flushed_segments - 1)
            deleted += 1
        return deleted

    @property
    def min_offset(self) -> int:
        return self._segments[0].start if self._segments else self.end

    def close(self) -> None:
        for segment in self._segments:
            segment.close()
        self._segments = []

    def _segment_at(self, offset: int) -> _Segment | None:
        for segment in reversed(self._segments):
            if segment.start <= offset < segment.start + self.segment_bytes:
                return segment
        return None

    def _new_segment(self, start: int) -> _Segment:
        segment = _Segment(self.directory / segment_name(start), start, self.segment_bytes)
        self._segments.append(segment)
        return segment

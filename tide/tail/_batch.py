"""Records a column at a time: :class:`RecordBatch` and the chunk scanner that fills it.

The per-record path (``scan_record`` plus a :class:`RecordAt` per record) costs
microseconds a record in Python; a dispatch replay wants well under one. So
:class:`ChunkScanner` takes the records of a Tail chunk a whole range at a time: in the
compiled core (``scan_v4_run``) or in its pure-Python reference,
:class:`tide.format.V4RunScanner`, which does it in a few passes of C-speed operations over
the whole chunk (tide/format/_record_scan.py describes them).

The checks are those of :func:`tide.format.scan_record` (plus ``max_record_bytes``). The
scan stops *before* the first record it does not take: a blank marker, an incomplete or
oversized record, a V2 magic (two-byte topic length), IPv6 hosts, or a record that fails a
check. The caller handles that unit on the per-record path, which accepts it (V2, IPv6),
skips it (blank marker), keeps it for the next chunk (incomplete), or raises with the exact
reason (corruption): the guarantees are the per-record path's, only the common case is
cheaper.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add

from tide.format import (
    HEADER_V4_BYTES,
    IntColumn,
    ScanColumns,
    ScanKind,
    ScanResult,
    V4RunScanner,
    _core,
    properties_position,
    record_body_crc,
)

HEAD_V4_BYTES = HEADER_V4_BYTES  # the fixed header with IPv4 hosts: the body starts here


class _GcPauses:
    """How many gc_paused() blocks are running, and whether the collector was enabled
    when the first began."""

    lock = threading.Lock()
    running = 0
    was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Keep the cyclic garbage collector from running inside a batch.

    Batch work allocates a few container objects per record (a tuple per regular
    expression match, lists) that live until the batch ends and never form cycles.
    Counted as allocations, they trigger young collections that traverse them and, as
    they survive those, promote them until full collections run over every object of
    the process: measured on a 256 KiB chunk, that was a third of the cost of applying
    it. Nested and concurrent pauses are counted; the collector is enabled again (if it
    was enabled) when the last one ends.
    """
    with _GcPauses.lock:
        _GcPauses.running += 1
        if _GcPauses.running == 1:
            _GcPauses.was_enabled = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _GcPauses.lock:
            _GcPauses.running -= 1
            if _GcPauses.running == 0 and _GcPauses.was_enabled:
                gc.enable()


@dataclass(frozen=True, slots=True)
class RecordAt:
    """One complete, checked record: its commitlog offset, size, scan and bytes."""

    offset: int
    size: int
    scan: ScanResult
    data: bytes

    @property
    def end_offset(self) -> int:
        return self.offset + self.size


class RecordBatch:
    """Complete, checked records in commitlog order, one column per field.

    Record ``i`` is ``data[positions[i] : positions[i] + sizes[i]]``, at commitlog offset
    ``offsets[i]``; its properties are ``data[props_starts[i] : positions[i] + sizes[i]]``.
    The integer columns are :data:`tide.format.IntColumn`: array('q') from the compiled
    scan (8 bytes a value, no int object a record), lists from its reference and from
    single records; the topics a list. The columns are shared, not copied: treat a
    batch as read-only. Body CRCs are read from the records when asked for
    (:meth:`body_crc`, :attr:`body_crcs`): dispatch needs one per batch.
    """

    __slots__ = (
        "data",
        "offsets",
        "positions",
        "props_starts",
        "queue_ids",
        "queue_offsets",
        "sizes",
        "store_timestamps",
        "sys_flags",
        "topics",
    )

    def __init__(
        self,
        data: bytes = b"",
        *,
        positions: IntColumn | None = None,
        offsets: IntColumn | None = None,
        sizes: IntColumn | None = None,
        queue_ids: IntColumn | None = None,
        queue_offsets: IntColumn | None = None,
        sys_flags: IntColumn | None = None,
        store_timestamps: IntColumn | None = None,
        topics: list[str] | None = None,
        props_starts: IntColumn | None = None,
    ) -> None:
        self.data = data
        self.positions: IntColumn = positions if positions is not None else []
        self.offsets: IntColumn = offsets if offsets is not None else []
        self.sizes: IntColumn = sizes if sizes is not None else []
        self.queue_ids: IntColumn = queue_ids if queue_ids is not None else []
        self.queue_offsets: IntColumn = queue_offsets if queue_offsets is not None else []
        self.sys_flags: IntColumn = sys_flags if sys_flags is not None else []
        self.store_timestamps: IntColumn = store_timestamps if store_timestamps is not None else []
        self.topics = topics if topics is not None else []
        self.props_starts: IntColumn = props_starts if props_starts is not None else []
        n = len(self.positions)
        assert all(
            len(column) == n
            for column in (
                self.offsets,
                self.sizes,
                self.queue_ids,
                self.queue_offsets,
                self.sys_flags,
                self.store_timestamps,
                self.topics,
                self.props_starts,
            )
        ), "columns of different lengths"

    def __len__(self) -> int:
        return len(self.offsets)

    def __bool__(self) -> bool:
        return bool(self.offsets)

    def __repr__(self) -> str:
        if not self.offsets:
            return "RecordBatch(empty)"
        return f"RecordBatch({len(self.offsets)} records, {self.offsets[0]}..{self.end_offset})"

    @property
    def start_offset(self) -> int:
        """Commitlog offset of the first record (the batch must not be empty)."""
        return self.offsets[0]

    @property
    def end_offset(self) -> int:
        """Just past the last record (the batch must not be empty)."""
        return self.offsets[-1] + self.sizes[-1]

    def body_crc(self, index: int) -> int:
        """The body CRC that record ``index`` stores."""
        return record_body_crc(self.data, self.positions[index])

    @property
    def body_crcs(self) -> list[int]:
        """The body CRC of every record (read from the records on each call)."""
        return [self.body_crc(index) for index in range(len(self.positions))]

    def record_bytes(self, index: int) -> bytes:
        start = self.positions[index]
        return self.data[start : start + self.sizes[index]]

    def properties_bytes(self, index: int) -> bytes:
        return self.data[self.props_starts[index] : self.positions[index] + self.sizes[index]]

    def record(self, index: int) -> RecordAt:
        offset, size = self.offsets[index], self.sizes[index]
        scan = ScanResult(
            ScanKind.RECORD,
            size=size,
            queue_id=self.queue_ids[index],
            queue_offset=self.queue_offsets[index],
            physical_offset=offset,
            sys_flag=self.sys_flags[index],
            store_timestamp_ms=self.store_timestamps[index],
            topic=self.topics[index],
        )
        return RecordAt(offset, size, scan, self.record_bytes(index))

    def records(self) -> list[RecordAt]:
        """The records as :class:`RecordAt` objects (the per-record API)."""
        return [self.record(index) for index in range(len(self.offsets))]

    def head(self, count: int) -> RecordBatch:
        """The first ``count`` records."""
        return self.slice(0, count)

    def slice(self, start: int, stop: int) -> RecordBatch:
        """Records ``start`` to ``stop`` (excluded), over the same data."""
        return RecordBatch(
            self.data,
            positions=self.positions[start:stop],
            offsets=self.offsets[start:stop],
            sizes=self.sizes[start:stop],
            queue_ids=self.queue_ids[start:stop],
            queue_offsets=self.queue_offsets[start:stop],
            sys_flags=self.sys_flags[start:stop],
            store_timestamps=self.store_timestamps[start:stop],
            topics=self.topics[start:stop],
            props_starts=self.props_starts[start:stop],
        )

    @classmethod
    def from_records(cls, records: Iterable[RecordAt]) -> RecordBatch:
        """A batch of already checked records (``RecordAt`` from any source)."""
        builder = BatchBuilder()
        for rec in records:
            builder.add_record(rec)
        return builder.build()


class BatchBuilder:
    """Collects scanned runs (from chunk buffers) and single records into one batch."""

    def __init__(self) -> None:
        self._buffers: list[bytes] = []  # each once, in order of first use
        self._buffer_index: dict[int, int] = {}  # id() of a buffer (kept alive above)
        self._runs: list[tuple[int, int]] = []  # (first record, buffer index) per run
        self.batch = RecordBatch()

    def __len__(self) -> int:
        return len(self.batch.offsets)

    def _buffer(self, buf: bytes) -> None:
        """The records added next are in ``buf``."""
        index = self._buffer_index.get(id(buf))
        if index is None:
            index = self._buffer_index[id(buf)] = len(self._buffers)
            self._buffers.append(buf)
        if not self._runs or self._runs[-1][1] != index:
            self._runs.append((len(self.batch.offsets), index))

    def add_record(self, rec: RecordAt) -> None:
        scan = rec.scan
        data = rec.data
        self._buffer(data)
        b = self.batch
        b.positions.append(0)
        b.offsets.append(rec.offset)
        b.sizes.append(rec.size)
        b.queue_ids.append(scan.queue_id)
        b.queue_offsets.append(scan.queue_offset)
        b.sys_flags.append(scan.sys_flag)
        b.store_timestamps.append(scan.store_timestamp_ms)
        b.topics.append(scan.topic)
        b.props_starts.append(properties_position(data))

    def build(self) -> RecordBatch:
        """The batch (positions into one buffer: the chunk itself when it is the only
        one, else the buffers joined, each once). The builder must not be used
        afterwards."""
        b = self.batch
        if len(self._buffers) <= 1:
            b.data = self._buffers[0] if self._buffers else b""
            return b
        b.data = b"".join(self._buffers)
        bases = list(accumulate(map(len, self._buffers), initial=0))
        ends = [first for first, _ in self._runs[1:]]
        ends.append(len(b.offsets))
        for (lo, index), hi in zip(self._runs, ends, strict=True):
            shift = bases[index]
            if shift and hi > lo:
                _shift(b.positions, lo, hi, shift)
                _shift(b.props_starts, lo, hi, shift)
        return b

    def build_runs(self) -> list[RecordBatch]:
        """The records as batches over their buffers, none joined, when they are in at
        most two runs (a record completed from a carry-over, then the chunk's); else
        :meth:`build`. No batch when there are no records. The builder must not be used
        afterwards."""
        b = self.batch
        if not b.offsets:
            return []
        if len(self._runs) != 2:
            return [self.build()]
        (_, first_buffer), (split, second_buffer) = self._runs
        head = b.head(split)
        head.data = self._buffers[first_buffer]
        for column in _BATCH_COLUMNS:
            del getattr(b, column)[:split]
        b.data = self._buffers[second_buffer]
        return [head, b]


def _shift(column: IntColumn, lo: int, hi: int, by: int) -> None:
    """Add ``by`` to ``column[lo:hi]``, the column keeping its kind."""
    shifted = map(add, column[lo:hi], repeat(by))
    if isinstance(column, array):
        column[lo:hi] = array("q", shifted)
    else:
        column[lo:hi] = list(shifted)


_BATCH_COLUMNS = tuple(name for name in RecordBatch.__slots__ if name != "data")
# The batch's columns in the order scan_v4_run answers them, after its stop.
_SCAN_COLUMNS = (
    "positions",
    "offsets",
    "sizes",
    "queue_ids",
    "queue_offsets",
    "sys_flags",
    "store_timestamps",
    "topics",
    "props_starts",
)
assert sorted(_SCAN_COLUMNS) == sorted(_BATCH_COLUMNS)


# A scan takes the records that start in this window (the next scan goes on from there).
# Scanning a 2 MiB chunk at once, its temporary buffers (the joined headers: ~750 KiB)
# were mapped and faulted in afresh for every chunk: a replay of 500,000 records took
# 21,600 page faults in-process, 3,600 with this window, and ~7 % less CPU.
_WALK_WINDOW = 1024 * 1024


class ChunkScanner:
    """The batch scan of whole records (see the module docstring). One per stream: it
    keeps a cache of decoded topics."""

    def __init__(
        self, max_record_bytes: int, *, check_crc: bool = True, compiled: bool = True
    ) -> None:
        self.max_record_bytes = max_record_bytes
        self.check_crc = check_crc
        # The reference scan (tide.format.V4RunScanner; it keeps a cache of decoded
        # topics: one per stream) and its compiled twin (tide.format._core), unless turned
        # off (the differential tests compare the two).
        self._reference = V4RunScanner(max_record_bytes, check_crc=check_crc)
        self._compiled = _core.scan_v4_run if compiled else None

    def scan(
        self, buf: bytes, start: int, base_offset: int, out: BatchBuilder, end: int | None = None
    ) -> int:
        """Take the whole, valid V1 IPv4 records from ``buf[start:end]`` (``buf[0]`` is at
        commitlog offset ``base_offset``; ``end`` defaults to the end of ``buf``) into
        ``out``; return where it stopped: ``end`` or the first unit it did not take."""
        end = len(buf) if end is None else end
        if not 0 <= start <= end <= len(buf):
            raise ValueError(
                f"scan: need 0 <= start <= end <= len(buf), got start {start}, end {end}, "
                f"len {len(buf)}"
            )
        if self._compiled is None:
            found = self._reference.scan(buf, start, end, base_offset, _WALK_WINDOW)
        else:
            found = self._compiled(
                buf, start, end, base_offset, self.max_record_bytes, self.check_crc, _WALK_WINDOW
            )
        stop = found[0]
        if stop == start:
            return start
        self._extend(out, buf, found)
        return stop

    @staticmethod
    def _extend(out: BatchBuilder, buf: bytes, found: ScanColumns) -> None:
        out._buffer(buf)
        b = out.batch
        fresh = not b.offsets  # the common case: the batch is this one run
        for name, column in zip(_SCAN_COLUMNS, found[1:], strict=True):
            if fresh:
                setattr(b, name, column)
            else:
                getattr(b, name).extend(column)

"""Turns ``Tail`` chunks (offset, raw commitlog bytes) back into whole records. No I/O.

A record may be split across chunks: its first bytes wait in a carry-over buffer, bounded
by ``max_record_bytes`` (a declared ``total_size`` above it raises instead of buffering).
A blank marker ends a segment: the rest of the segment is skipped and the stream resumes
at the next segment's first offset, ``marker offset + blank size``. The server may send
the marker's filler bytes first (the current storage service does), so a chunk after a
marker may also continue exactly where the previous one stopped, inside the filler; any
other offset is a :class:`TailProtocolError`.

Every record is checked as :func:`tide.format.scan_record` checks it, with its expected
physical offset (and body CRC unless turned off): the stream only ever carries valid
records. The common records (V1 magic, IPv4 hosts) of a chunk are found and checked a
chunk at a time by :class:`tide.tail._batch.ChunkScanner`; everything else (a record
split across chunks, a blank marker, V2 or IPv6 records, and whatever the batch scan
refuses) goes through ``scan_record`` one unit at a time, which also words the errors.

:meth:`RecordAssembler.feed_batch` returns the records as one column-wise
:class:`RecordBatch` (what dispatch uses); :meth:`RecordAssembler.feed` as a list of
:class:`RecordAt`.
"""

from __future__ import annotations

from typing import NamedTuple

from tide.format import (
    BLANK_MAGIC,
    BLANK_MARKER_BYTES,
    FIXED_BYTES_V4,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    RECORD_HEAD,
    ScanKind,
    scan_record,
)
from tide.limits import RECORD_MAX_BYTES
from tide.tail._batch import BatchBuilder, ChunkScanner, RecordAt, RecordBatch, gc_paused
from tide.tail._errors import TailCorruptionError, TailError, TailProtocolError

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "RecordAssembler", "RecordAt", "RecordBatch"]

# The largest record any storage writes (tide.limits): whatever the storage's own
# --max-message-body-bytes, a record it took can be followed.
DEFAULT_MAX_RECORD_BYTES = RECORD_MAX_BYTES
_HEAD = RECORD_HEAD  # total_size, magic
_MESSAGE_MAGICS = (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2)


class _Need(NamedTuple):
    """Not enough bytes yet: the unit at this position is ``size`` bytes long (or at
    least a marker head's worth, when the head itself is incomplete)."""

    size: int


class _Blank(NamedTuple):
    offset: int
    size: int


class RecordAssembler:
    """Feed it chunks in stream order; it returns the records each chunk completes."""

    def __init__(
        self,
        offset: int,
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        check_crc: bool = True,
    ) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0 (got {offset})")
        if max_record_bytes < FIXED_BYTES_V4:
            raise ValueError(f"max_record_bytes must be >= {FIXED_BYTES_V4}")
        self._max_record_bytes = max_record_bytes
        self._check_crc = check_crc
        self._next = offset  # first byte not consumed as a complete record or marker
        self._received = offset  # just past the last byte received
        self._carry = bytearray()  # bytes from self._next: an incomplete record or head
        self._blank: _Blank | None = None  # the last blank marker seen
        self._in_filler = False  # the filler of self._blank is still arriving
        self._scanner = ChunkScanner(max_record_bytes, check_crc=check_crc)

    @property
    def next_offset(self) -> int:
        """Where to resume: the first byte not yet consumed as a complete record (after a
        blank marker, the next segment's first offset)."""
        return self._next

    @property
    def expected_offset(self) -> int:
        """Where the next chunk must start (or, after a blank marker, the next segment)."""
        return self._received

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete record held in the carry-over buffer."""
        return len(self._carry)

    def feed(self, offset: int, data: bytes | memoryview) -> list[RecordAt]:
        """Take one chunk; return the records it completes, in order.

        Raises :class:`TailProtocolError` (an offset out of sequence, unwritten bytes, a
        bad blank marker) or :class:`TailCorruptionError` (invalid record bytes); the
        error's ``records_before`` holds the valid records the chunk completed before it,
        and :attr:`next_offset` is the offset of the bad bytes. After an error the
        assembler is unusable.
        """
        return self.feed_batch(offset, data).records()

    def feed_batch(self, offset: int, data: bytes | memoryview) -> RecordBatch:
        """:meth:`feed`, with the records as one :class:`RecordBatch` (no object per
        record). On an error, ``batch_before`` (and ``records_before``) hold the valid
        records the chunk completed before it."""
        self._check_continuity(offset)
        self._received = offset + len(data)
        if self._carry and not self._in_filler and self._carry_completes(data):
            # The unit held over ends in this chunk: scan both as one (one copy) rather
            # than completing it on its own and joining the batch's buffers afterwards.
            data = bytes(self._carry) + data
            offset = self._next
            self._carry = bytearray()
        elif type(data) is not bytes:
            data = bytes(data)  # (a view: the batch keeps what it points into)
        out = BatchBuilder()
        self._consume_or_raise(offset, data, 0, len(data), out)
        return out.build()

    def feed_chunk(
        self, offset: int, buf: bytes, start: int = 0, stop: int | None = None
    ) -> list[RecordBatch]:
        """:meth:`feed_batch` of the chunk ``buf[start:stop]`` (at commitlog ``offset``)
        without copying it: its records come as a batch over ``buf`` itself, and a record
        begun in an earlier chunk as a batch of its own before it. So none, one or two
        batches, in order (one, joined, when per-record units split the chunk's runs).
        Errors as :meth:`feed_batch` raises them."""
        stop = len(buf) if stop is None else stop
        if not 0 <= start <= stop <= len(buf):
            raise ValueError(f"chunk bounds [{start}, {stop}) outside a {len(buf)}-byte buffer")
        self._check_continuity(offset)
        self._received = offset + stop - start
        out = BatchBuilder()
        self._consume_or_raise(offset - start, buf, start, stop, out)
        return out.build_runs()

    def _consume_or_raise(
        self, base: int, data: bytes, start: int, stop: int, out: BatchBuilder
    ) -> None:
        """Consume ``data[start:stop]`` (``data[0]`` at commitlog ``base``) into ``out``;
        on an error, hand what came before to the exception."""
        try:
            with gc_paused():
                self._consume_chunk(base, data, start, stop, out)
        except TailError as exc:
            batch = out.build()
            exc.batch_before = batch
            exc.records_before = tuple(batch.records())
            raise

    def _consume_chunk(
        self, base: int, data: bytes, pos: int, stop: int, out: BatchBuilder
    ) -> None:
        with memoryview(data) as whole, whole[:stop] as view:
            while pos < stop:
                if self._in_filler:
                    pos = self._skip_filler(view, pos, base)
                elif self._carry:
                    pos = self._fill_carry(view, pos, out)
                else:
                    pos = self._parse(data, view, pos, base, out)

    def _carry_completes(self, data: bytes | memoryview) -> bool:
        with memoryview(self._carry) as carry:
            unit = self._unit(carry, 0, self._next)
        return not isinstance(unit, _Need) or len(self._carry) + len(data) >= unit.size

    # -- continuity --------------------------------------------------------------
    def _check_continuity(self, offset: int) -> None:
        if self._in_filler and self._blank is not None:
            segment_start = self._blank.offset + self._blank.size
            if offset == segment_start:
                self._in_filler = False
                self._received = offset
                return
            if offset != self._received:
                raise TailProtocolError(
                    offset,
                    f"chunk at offset {offset} after the blank marker at {self._blank.offset} "
                    f"({self._blank.size} bytes): expected the next segment at "
                    f"{segment_start} (or the marker's filler at {self._received})",
                )
            return
        if offset != self._received:
            raise TailProtocolError(offset, self._gap_message(offset))

    def _gap_message(self, offset: int) -> str:
        message = f"chunk at offset {offset}, expected {self._received}"
        blank = self._blank
        if blank is not None and blank.offset + blank.size == self._received:
            message += (
                f" (the next segment's first offset after the blank marker at {blank.offset},"
                f" {blank.size} bytes)"
            )
        return message

    # -- the three states --------------------------------------------------------
    def _skip_filler(self, view: memoryview, pos: int, base: int) -> int:
        """Skip the rest of a blank marker; return the position after what was skipped."""
        assert self._blank is not None
        end = min(len(view), self._blank.offset + self._blank.size - base)
        assert end >= pos, (end, pos)
        if base + end == self._blank.offset + self._blank.size:
            self._in_filler = False
        return end

    def _fill_carry(self, view: memoryview, pos: int, out: BatchBuilder) -> int:
        """Move bytes into the carry-over until its unit is complete, then consume it."""
        while True:
            with memoryview(self._carry) as carry:
                unit = self._unit(carry, 0, self._next)
            if not isinstance(unit, _Need):
                self._carry.clear()
                self._consume(unit, out)
                return pos
            take = min(unit.size - len(self._carry), len(view) - pos)
            if take <= 0:
                return pos
            self._carry += view[pos : pos + take]
            pos += take

    def _parse(self, data: bytes, view: memoryview, pos: int, base: int, out: BatchBuilder) -> int:
        """Consume whole units straight from the chunk (the common records a run at a
        time, the rest one by one); keep an incomplete one."""
        while pos < len(view):
            assert base + pos == self._next, (base, pos, self._next)
            scanned = self._scanner.scan(data, pos, base, out, len(view))
            if scanned > pos:
                pos = scanned
                self._next = base + pos
                continue
            unit = self._unit(view, pos, self._next)
            if isinstance(unit, _Need):
                self._carry = bytearray(view[pos:])
                return len(view)
            self._consume(unit, out)
            if isinstance(unit, _Blank):
                return pos + BLANK_MARKER_BYTES
            pos += unit.size
        return pos

    def _consume(self, unit: RecordAt | _Blank, out: BatchBuilder) -> None:
        if isinstance(unit, _Blank):
            self._blank = unit
            self._in_filler = unit.size > BLANK_MARKER_BYTES
            self._next = unit.offset + unit.size
            return
        out.add_record(unit)
        self._next = unit.offset + unit.size

    # -- one unit ----------------------------------------------------------------
    def _unit(self, buf: memoryview, pos: int, offset: int) -> RecordAt | _Blank | _Need:
        """What starts at ``buf[pos]`` (commitlog ``offset``): a record, a blank marker,
        or how many bytes it needs."""
        avail = len(buf) - pos
        if avail < BLANK_MARKER_BYTES:
            return _Need(BLANK_MARKER_BYTES)
        total_size, magic = _HEAD.unpack_from(buf, pos)
        if magic == BLANK_MAGIC:
            return self._blank_marker(offset, total_size)
        if total_size == 0 and magic == 0:
            raise TailProtocolError(
                offset,
                f"unwritten (zero) bytes at offset {offset}: the server must only send "
                "written bytes",
            )
        if magic not in _MESSAGE_MAGICS:
            raise TailCorruptionError(
                offset, f"bad magic 0x{magic & 0xFFFFFFFF:08X} (total_size {total_size})"
            )
        if not FIXED_BYTES_V4 <= total_size <= self._max_record_bytes:
            raise TailCorruptionError(
                offset,
                f"declared total_size {total_size} outside [{FIXED_BYTES_V4}, "
                f"{self._max_record_bytes}] (max_record_bytes)",
            )
        if avail < total_size:
            return _Need(total_size)
        return self._record(buf, pos, offset, total_size)

    def _blank_marker(self, offset: int, size: int) -> _Blank:
        # A blank is written when a record of at most max_record_bytes does not fit with
        # 8 bytes to spare, so it is never longer than that.
        limit = self._max_record_bytes + BLANK_MARKER_BYTES
        if not BLANK_MARKER_BYTES <= size <= limit:
            raise TailProtocolError(
                offset,
                f"blank marker at offset {offset} declares {size} bytes; expected "
                f"[{BLANK_MARKER_BYTES}, {limit}]",
            )
        return _Blank(offset, size)

    def _record(self, buf: memoryview, pos: int, offset: int, size: int) -> RecordAt:
        scan = scan_record(buf, pos, pos + size, expected_offset=offset, check_crc=self._check_crc)
        if scan.kind is not ScanKind.RECORD or scan.size != size:
            raise TailCorruptionError(offset, scan.reason or f"not a record ({scan.kind.value})")
        return RecordAt(offset, size, scan, bytes(buf[pos : pos + size]))

"""The records arrival notices carried, kept per queue so that pulls from there are
answered without asking the dispatch (long_poll.py feeds it, pull.py reads it).

Why: a consumer that keeps up finds a few new records at almost every pull, so its pulls
are rarely held and woken with a notice's entries; each asked the dispatch
(GetQueueEntries) for records the dispatch had pushed in a notice moments before. That
is a second turn of the dispatch's event loop per pull after the one that applied the
records, and on a busy machine a process waits for the CPU between turns: measured, the
dispatch's loop went 50-260 ms without running several times a second under load, and
the consumer's pulls waited for it (docs/performance.md, "The batched stream path with a
consumer"). With the notices' entries kept here, one dispatch turn (apply, notify)
brings the records to the gateway.

Per queue (dispatch address, topic, queue id) the newest contiguous run of notice
entries, as parts (one notice's GetQueueEntries answer each): a notice whose entries start
where the run ends extends it; any other replaces it. A notice announcing a max offset
below the run's end (the dispatch cut its queue after its storage lost records) drops
the run, and so does a watch that broke. At most ``max_queue_bytes`` of records per queue
(the oldest parts go first) and ``max_total_bytes`` in all (past it everything is
dropped at once: pulls then ask the dispatch, as before).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tide.v1 import dispatch_pb2 as dispatch_pb

QueueKey = tuple[str, str, int]  # (dispatch address, topic, queue id)
# A span: (commitlog offset, bytes, records); records back to back from the offset.
_Span = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class ArrivedAnswer:
    """Records from the pull's offset: ``count`` of them, the next offset after them and
    the queue's offsets as the newest notice gave them."""

    records: bytes
    count: int
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(slots=True)
class _Part:
    start: int  # queue offset of the first entry
    end: int  # just past the last entry
    spans: list[_Span]
    records: bytes  # the spans' records back to back


@dataclass(slots=True)
class _Run:
    parts: deque[_Part]
    size_bytes: int
    min_offset: int
    max_offset: int

    @property
    def end(self) -> int:
        return self.parts[-1].end


class ArrivedEntries:
    def __init__(self, *, max_queue_bytes: int, max_total_bytes: int) -> None:
        self._max_queue_bytes = max_queue_bytes
        self._max_total_bytes = max_total_bytes
        self._runs: dict[QueueKey, _Run] = {}
        self._total_bytes = 0

    @property
    def held_bytes(self) -> int:
        return self._total_bytes

    def add(self, key: QueueKey, notice: dispatch_pb.ArrivalNotice) -> None:
        """Take in ``notice`` (entries or not: a lower max offset drops the run)."""
        run = self._runs.get(key)
        if run is not None and notice.max_offset < run.end:
            self._drop(key)
            run = None
        if not notice.HasField("entries") or not notice.entries.records:
            if run is not None:
                run.max_offset = max(run.max_offset, notice.max_offset)
            return
        entries = notice.entries
        part = _Part(
            start=notice.entries_offset,
            end=entries.next_offset,
            spans=[(span.physical_offset, span.size, span.count) for span in entries.spans],
            records=entries.records,
        )
        if not _consistent(part):  # not what a dispatch sends: not kept (pulls ask)
            if run is not None:
                self._drop(key)
            return
        if run is None or run.end != part.start:
            if run is not None:
                self._drop(key)
            run = self._runs[key] = _Run(deque(), 0, entries.min_offset, notice.max_offset)
        run.parts.append(part)
        run.size_bytes += len(part.records)
        self._total_bytes += len(part.records)
        run.min_offset = entries.min_offset
        run.max_offset = max(notice.max_offset, entries.max_offset)
        while run.size_bytes > self._max_queue_bytes and len(run.parts) > 1:
            gone = run.parts.popleft()
            run.size_bytes -= len(gone.records)
            self._total_bytes -= len(gone.records)
        if self._total_bytes > self._max_total_bytes:
            self.clear()

    def forget_address(self, address: str) -> None:
        """Drop the runs of a dispatch whose watch broke (it may have restarted)."""
        for key in [key for key in self._runs if key[0] == address]:
            self._drop(key)

    def clear(self) -> None:
        self._runs.clear()
        self._total_bytes = 0

    def _drop(self, key: QueueKey) -> None:
        run = self._runs.pop(key)
        self._total_bytes -= run.size_bytes

    def take(
        self, key: QueueKey, offset: int, max_count: int, max_bytes: int
    ) -> ArrivedAnswer | None:
        """The records from ``offset``, at most ``max_count`` and no more bytes than
        ``max_bytes`` (but at least one record), as GetQueueEntries selects them; None
        when the run does not hold ``offset``."""
        run = self._runs.get(key)
        if run is None or not run.parts[0].start <= offset < run.end:
            return None
        pieces: list[bytes] = []
        count = size = 0
        position = offset
        for part in run.parts:
            if part.end <= position:
                continue
            position, taken, taken_bytes = _take_from(
                part, position, max_count - count, max_bytes - size, pieces, first=not count
            )
            count += taken
            size += taken_bytes
            if position < part.end:  # a limit stopped it
                break
        records = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return ArrivedAnswer(records, count, position, run.min_offset, run.max_offset)


def _take_from(
    part: _Part, offset: int, max_count: int, max_bytes: int, pieces: list[bytes], *, first: bool
) -> tuple[int, int, int]:
    """Records of ``part`` from ``offset`` into ``pieces`` within the limits (one at least
    when ``first``): (next offset, records taken, bytes taken). The rest of a span that
    fits is sliced out whole; only a span cut by a limit is walked record by record
    (each record starts with its 4-byte big-endian total size)."""
    entry = part.start  # queue offset of the span's first record
    position = 0  # where the span starts in part.records
    taken = taken_bytes = 0
    records = part.records
    for _, span_size, span_count in part.spans:
        span_end = position + span_size
        if entry + span_count > offset:
            skip = max(0, offset - entry)
            start = _walk(records, position, skip)
            left = span_count - skip
            if left <= max_count - taken and span_end - start <= max_bytes - taken_bytes:
                pieces.append(records[start:span_end])
                taken += left
                taken_bytes += span_end - start
            else:  # a limit cuts the span: take what fits and stop
                end = start
                took = 0
                while took < min(left, max_count - taken):
                    size = int.from_bytes(records[end : end + 4], "big")
                    if taken_bytes + size > max_bytes and (taken + took or not first):
                        break
                    end += size
                    took += 1
                    taken_bytes += size
                if took:
                    pieces.append(records[start:end])
                return entry + skip + took, taken + took, taken_bytes
        entry += span_count
        position = span_end
    return entry, taken, taken_bytes


def _consistent(part: _Part) -> bool:
    """The spans count the part's entries and size its records."""
    return (
        part.start < part.end
        and sum(span[2] for span in part.spans) == part.end - part.start
        and sum(span[1] for span in part.spans) == len(part.records)
    )


def _walk(records: bytes, position: int, count: int) -> int:
    """The position ``count`` records after ``position``."""
    for _ in range(count):
        position += int.from_bytes(records[position : position + 4], "big")
    return position

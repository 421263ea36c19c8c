"""The records arrival notices carried, kept a while so that the pulls after them are
answered without asking the dispatch.

A dispatch's ``WatchArrivals`` notice carries a queue's new records when a records
reader kept up there lately (long_poll.py). A pull held at the queue's end when the
notice comes is answered with them; but a consumer busy with its previous answer pulls a
moment later, from an offset the notices already passed, and that pull used to ask the
dispatch for the very records the gateway had just been sent (in target 3's shape, 60 %
of the pulls). The gateway keeps each queue's run of notices' records here, and a records
pull of ``*`` whose offset falls in the run is answered from it: what ``GetQueueEntries``
would have answered (the records are the stored bytes, immutable once written), with no
internal call. This is the step the ceiling's relay gateway takes (bench/hop_ceiling.py
serves pulls from the chunks its dispatch pushed); RocketMQ's proxy has no such cache,
its broker's pull reads the page cache in the same process.

What is kept, and its bounds:

* a queue's run is contiguous: a notice whose records start where the run ends extends
  it; any other (a notice without records in between, records cut short by a byte limit)
  starts the run again. A notice without records changes nothing here (the max offset
  the stream announced is long_poll.py's, passed to :meth:`ArrivedRecords.answer`).
* a run holds at most ``queue_max_bytes`` (the gateway's ``--max-pull-bytes``: a
  consumer that keeps up trails the end by about one pull; its newest piece always), and
  all runs at most ``max_bytes`` (``--max-arrived-records-bytes``; the queue whose run
  grew least recently goes first). 0 keeps nothing: pulls then ask the dispatch.
* a piece older than ``KEEP_S`` is not answered from (retention may since have deleted
  what a queue idle that long still has here; the dispatch says so).
* a queue found shorter than it was (rebuilt by a dispatch whose storage cut its
  commitlog), and every queue of a dispatch whose stream ended, is forgotten: what follows
  may not be what was announced (long_poll.py calls :meth:`forget`).

An answer is as full as a read's: it stops at ``max_messages`` or past the pull's byte
limit (at least one record), or at the run's end only when the run reaches the max offset
announced last; otherwise (the run ends before it) the pull asks the dispatch, which has
more.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tide.format import record_total_size
from tide.v1 import dispatch_pb2 as dispatch_pb

log = logging.getLogger("tide.gateway.arrived")

QueueKey = tuple[str, str, int]  # (dispatch address, topic, queue id)
# A piece older than this is not answered from: the dispatch carries records in its
# notices for this long after a reader kept up (its CAUGHT_UP_S), and a queue that got
# nothing new for longer is read from the dispatch, which knows what retention removed.
KEEP_S = 30.0


@dataclass(slots=True)
class _Piece:
    """One notice's records: ``count`` records from queue offset ``offset``, in runs of
    adjacent records (``spans``: (size, count) each), back to back in ``records``."""

    offset: int
    count: int
    spans: list[tuple[int, int]]
    records: bytes
    arrived_s: float


@dataclass(slots=True)
class _Run:
    pieces: deque[_Piece] = field(default_factory=deque)
    size_bytes: int = 0
    # The min offset the queue's last notice with records said.
    min_offset: int = 0

    @property
    def start(self) -> int:
        return self.pieces[0].offset

    @property
    def end(self) -> int:
        last = self.pieces[-1]
        return last.offset + last.count


@dataclass(frozen=True, slots=True)
class Answer:
    """A pull's records from the run: ``count`` records from the pull's offset."""

    records: bytes
    count: int
    next_offset: int
    min_offset: int
    max_offset: int


class ArrivedRecords:
    def __init__(
        self,
        *,
        max_bytes: int,
        queue_max_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._max_bytes = max_bytes
        self._queue_max_bytes = queue_max_bytes
        self._runs: OrderedDict[QueueKey, _Run] = OrderedDict()
        self._size_bytes = 0
        # Pulls answered from here (a metric).
        self.answers = 0

    @property
    def size_bytes(self) -> int:
        """Record bytes kept now (a metric)."""
        return self._size_bytes

    def add(self, key: QueueKey, notice: dispatch_pb.ArrivalNotice) -> None:
        """Take in a notice of the queue: its records extend the run or start it again
        (one without records is not kept)."""
        if not notice.HasField("entries") or not self._max_bytes:
            return
        run = self._runs.get(key)
        entries = notice.entries
        spans = [(span.size, span.count) for span in entries.spans]
        count = sum(span_count for _, span_count in spans)
        records = entries.records
        if not count or len(records) != sum(size for size, _ in spans):
            return  # nothing to keep (or not all its records: never so, not relied on)
        piece = _Piece(notice.entries_offset, count, spans, records, self._clock())
        if run is None or run.end != piece.offset:
            self.forget(key)
            run = self._runs[key] = _Run()
        else:
            self._runs.move_to_end(key)
        run.pieces.append(piece)
        run.size_bytes += len(records)
        self._size_bytes += len(records)
        run.min_offset = entries.min_offset
        while run.size_bytes > self._queue_max_bytes and len(run.pieces) > 1:
            self._drop_first(run)
        while self._size_bytes > self._max_bytes and self._runs:
            self.forget(next(iter(self._runs)))
        self._drop_stale(piece.arrived_s)

    def _drop_stale(self, now_s: float) -> None:
        """Forget the runs that last grew KEEP_S ago or more (queues no longer written,
        or no longer read to their end): they are in the order they last grew."""
        while self._runs:
            key, run = next(iter(self._runs.items()))
            if run.pieces[-1].arrived_s >= now_s - KEEP_S:
                return
            self.forget(key)

    def forget(self, key: QueueKey) -> None:
        """Keep nothing of the queue (it shrank; its stream ended)."""
        run = self._runs.pop(key, None)
        if run is not None:
            self._size_bytes -= run.size_bytes

    def forget_address(self, address: str) -> None:
        for key in [key for key in self._runs if key[0] == address]:
            self.forget(key)

    def answer(
        self, key: QueueKey, offset: int, max_messages: int, max_bytes: int, max_offset: int
    ) -> Answer | None:
        """The records from ``offset`` a read would answer (at most ``max_messages``,
        stopping before the record that would pass ``max_bytes``, at least one), or None
        when the run does not hold ``offset`` or ends before both the pull's limits and
        ``max_offset``, the queue's max the open stream announced last (the dispatch has
        more)."""
        run = self._runs.get(key)
        if run is None:
            return None
        self._drop_old(key, run)
        if not run.pieces or not run.start <= offset < run.end:
            return None
        taken: list[memoryview] = []
        count = size = 0
        index = _piece_at(run.pieces, offset)
        skip = offset - run.pieces[index].offset
        full = False
        try:
            for piece in itertools.islice(run.pieces, index, None):
                got, got_bytes, full = _take(
                    piece, skip, max_messages - count, max_bytes - size, taken
                )
                count, size, skip = count + got, size + got_bytes, 0
                if full:
                    break
        except _NotRecords as exc:
            # Never so (the dispatch sends stored records its storage checked); asked
            # of the dispatch instead, and not kept.
            log.warning("arrived records of %s/%d on %s: %s", key[1], key[2], key[0], exc)
            self.forget(key)
            return None
        if not full and offset + count < max_offset:
            return None
        self.answers += 1
        next_offset = offset + count
        return Answer(b"".join(taken), count, next_offset, run.min_offset, max_offset)

    def _drop_first(self, run: _Run) -> None:
        piece = run.pieces.popleft()
        run.size_bytes -= len(piece.records)
        self._size_bytes -= len(piece.records)

    def _drop_old(self, key: QueueKey, run: _Run) -> None:
        oldest_s = self._clock() - KEEP_S
        while run.pieces and run.pieces[0].arrived_s < oldest_s:
            self._drop_first(run)
        if not run.pieces:
            self.forget(key)


class _NotRecords(ValueError):
    """A piece's bytes do not split into the records its spans count."""


def _record_size(view: memoryview, pos: int, end: int) -> int:
    """The size of the record at ``pos``, checked to end within its span (at ``end``)."""
    size = record_total_size(view, pos)
    if not 0 < size <= end - pos:
        raise _NotRecords(f"a record of {size} bytes at byte {pos} of a span ending at {end}")
    return size


def _piece_at(pieces: deque[_Piece], offset: int) -> int:
    """The index of the piece holding ``offset`` (in the run), looked for from the newest:
    a consumer that keeps up pulls from the last few."""
    index = len(pieces) - 1
    while pieces[index].offset > offset:
        index -= 1
    return index


def _take(
    piece: _Piece, skip: int, max_count: int, max_bytes: int, taken: list[memoryview]
) -> tuple[int, int, bool]:
    """Append to ``taken`` the piece's records after its first ``skip``, at most
    ``max_count`` and stopping before the one that would pass ``max_bytes`` (but at least
    one when nothing is taken yet: ``taken`` empty): (records, bytes, whether a limit
    stopped it)."""
    view = memoryview(piece.records)
    pos = count = size = 0
    for span_size, span_count in piece.spans:
        if skip >= span_count:  # the whole span lies before the pull's offset
            skip -= span_count
            pos += span_size
            continue
        end = pos + span_size
        for _ in range(skip):
            pos += _record_size(view, pos, end)
        left = span_count - skip
        skip = 0
        if left <= max_count - count and end - pos <= max_bytes - size:
            taken.append(view[pos:end])  # the rest of the span fits whole
            count, size, pos = count + left, size + end - pos, end
            continue
        while pos < end:
            record = _record_size(view, pos, end)
            if count == max_count or (size + record > max_bytes and taken):
                return count, size, True
            taken.append(view[pos : pos + record])
            count, size, pos = count + 1, size + record, pos + record
    return count, size, count == max_count

"""The tail cache: the newest commitlog records the dispatch has followed and applied,
kept in memory by commitlog offset (``--tail-cache-bytes``).

Why: a pull through the gateway costs two internal hops, GetQueueEntries (which records)
then Storage/Read (their bytes). The dispatcher has just received the newest records'
bytes from the Tail stream, so for consumers that keep up GetQueueEntries can answer the
bytes too (``GetQueueEntriesRequest.records``) and save the gateway the Storage/Read hop.

The cache holds *runs*: commitlog ranges ``[start, end)`` of records back to back, each a
reference into the bytes a :class:`~tide.tail.RecordBatch` points into (the received Tail
chunk: no copy). A batch is one run in the common case, found in one call
(``tide.format.back_to_back_runs``, compiled); a batch whose records are not back to
back (a blank marker between segments, a record joined from two chunks) is split into
runs. Runs are kept in offset order, strictly
increasing and never overlapping; the oldest are evicted past ``max_bytes``, counted as
the memory really held (the whole buffer a run references, plus a per-run overhead).

The dispatch's own readers of records (delay levels, timer, transactions, POP) look here
first and read only the misses from the storage, through read_through.py.

Everything runs on the event loop (the dispatcher adds, the servicer reads): no locks.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import NamedTuple

from tide.format import back_to_back_runs
from tide.tail import RecordBatch

# What a run costs beyond the bytes it references (the run tuple, its list slots).
RUN_OVERHEAD_BYTES = 128
# Evicted runs are removed from the front of the lists once this many have gone (and at
# least half the lists): eviction stays O(1) amortized.
_COMPACT_MIN = 256


class _Run(NamedTuple):
    """Commitlog bytes ``[start, end)``: ``data[position : position + end - start]``."""

    start: int
    end: int
    data: bytes
    position: int
    cost: int  # bytes charged against max_bytes


# What an evicted run's place holds until the lists are compacted (nothing).
_EVICTED = _Run(0, 0, b"", 0, 0)


class TailCache:
    """The newest records' bytes by commitlog offset, at most ``max_bytes`` held (0: off).

    ``hits`` / ``misses`` count :meth:`records` calls answered / not (whole calls, as the
    answer is all or nothing; ``counted=False`` calls, the arrival notices' entries, are
    not: the counters are the pulls' reads); ``held_bytes`` is the memory charged.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (got {max_bytes})")
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._held = 0
        self._starts: list[int] = []  # run starts, for bisect (from self._first on)
        self._runs: list[_Run] = []
        self._first = 0  # runs before this index are evicted

    def __len__(self) -> int:
        """Runs held."""
        return len(self._runs) - self._first

    @property
    def held_bytes(self) -> int:
        return self._held

    @property
    def end_offset(self) -> int:
        """Just past the newest byte held (0 when empty)."""
        return self._runs[-1].end if len(self) else 0

    def clear(self) -> None:
        """Drop everything (the commitlog may have changed under what is held)."""
        self._held = 0
        self._starts = []
        self._runs = []
        self._first = 0

    def add(self, batch: RecordBatch) -> None:
        """Remember ``batch``'s records (already applied: they may be served). A batch that
        starts below what is held (a follower restarted further back) clears it first."""
        if not self.max_bytes or not batch:
            return
        if batch.start_offset < self.end_offset:
            self.clear()
        # One run in the common case (records back to back), found in one call.
        for start, end, position in back_to_back_runs(batch.offsets, batch.positions, batch.sizes):
            self._append(batch.data, start, end, position)
        self._evict(self.max_bytes)

    def discard_below(self, offset: int) -> None:
        """Drop the runs that start below ``offset`` (the storage no longer holds it)."""
        while len(self) and self._runs[self._first].start < offset:
            self._pop_oldest()
        self._compact()

    def get(self, offset: int, size: int) -> bytes | memoryview | None:
        """Commitlog bytes ``[offset, offset + size)`` when held entirely (in one run or
        in runs back to back), else None."""
        parts: list[memoryview] = []
        if not self._collect(offset, size, parts):
            return None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def records(
        self, spans: Iterable[tuple[int, int]], *, counted: bool = True
    ) -> list[memoryview] | None:
        """Every span's bytes ((offset, size) pairs) back to back, when all are held (what
        Storage/Read of those spans answers), else None; no spans: None, not counted. As
        views into the held buffers, in order, not joined (an answer framed by hand
        copies them once, into itself). Each view holds its buffer (immutable bytes), so
        an eviction meanwhile does not change it."""
        parts: list[memoryview] = []
        for offset, size in spans:
            if not self._collect(offset, size, parts):
                self.misses += counted
                return None
        if not parts:
            return None
        self.hits += counted
        return parts

    # -- internals -----------------------------------------------------------------
    def _collect(self, offset: int, size: int, parts: list[memoryview]) -> bool:
        """Append views of ``[offset, offset + size)`` to ``parts``; False (``parts`` then
        partly filled) when not all of it is held."""
        if size <= 0:
            return False
        index = bisect_right(self._starts, offset, self._first) - 1
        if index < self._first:
            return False
        end = offset + size
        runs = self._runs
        while True:
            run = runs[index]
            if offset >= run.end:
                return False
            stop = min(end, run.end)
            skip = run.position - run.start
            parts.append(memoryview(run.data)[skip + offset : skip + stop])
            if stop == end:
                return True
            index += 1
            if index == len(runs) or runs[index].start != stop:
                return False
            offset = stop

    def _append(self, data: bytes, start: int, end: int, position: int) -> None:
        size = end - start
        if position < 0 or position + size > len(data):
            return  # not the records' bytes (a batch built by hand): nothing to serve
        if 2 * size < len(data):  # a small part of a large buffer: hold a copy instead
            data, position = data[position : position + size], 0
        assert start >= self.end_offset, f"run {start}..{end} below {self.end_offset}"
        cost = len(data) + RUN_OVERHEAD_BYTES
        self._runs.append(_Run(start, end, data, position, cost))
        self._starts.append(start)
        self._held += cost

    def _evict(self, max_bytes: int) -> None:
        while self._held > max_bytes and len(self):
            self._pop_oldest()
        self._compact()

    def _pop_oldest(self) -> None:
        """Evict the oldest run and let go of its bytes now: left in the list until the
        next compaction, evicted runs held up to max_bytes more (a full cache of ~120 KB
        chunks compacts every ~500 runs), freed in bursts that handed the heap's top back
        to the kernel, to be faulted in again by the chunks received next."""
        first = self._first
        self._held -= self._runs[first].cost
        self._runs[first] = _EVICTED
        self._first = first + 1

    def _compact(self) -> None:
        first = self._first
        if first == len(self._runs):
            self.clear()
        elif first >= _COMPACT_MIN and 2 * first >= len(self._runs):
            del self._runs[:first], self._starts[:first]
            self._first = 0

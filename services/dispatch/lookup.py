"""Lookups that need the messages themselves, read from the storage: the queue offset for
a store time (SearchOffset) and key verification of index candidates (QueryIndex).

Both read consume queues on the dispatch's reader threads, not on the event loop: entries
far apart (a search's probes, candidates anywhere in a queue) are the ones least likely
to be in memory, and those threads read the files with pread (the GIL free while the
disk answers; services/dispatch/servicer.py).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

from services.dispatch.engine.consume_queue import (
    ConsumeQueue,
    ConsumeQueueChangedError,
    Entry,
)
from services.dispatch.engine.consume_queue_store import ConsumeQueueStore
from tide.format import UNIQ_KEY
from tide.v1 import storage_pb2 as pb

ReadFn = Callable[[Sequence[tuple[int, int]]], Awaitable[list[pb.ReadResult]]]
# A search round's probes (first point mapping to each entry, the entry), and the range's
# end as they narrowed it.
Probes = tuple[list[tuple[int, Entry]], int]
# Runs a round's consume-queue reads, off the event loop (the servicer's reader threads).
OffLoop = Callable[[Callable[[], Probes]], Awaitable[Probes]]

# SearchOffset: probes read per round (one Read call), and a bound on rounds. Each round
# narrows the range to about 1/SEARCH_PROBES of itself, so 16 probes need at most 17
# rounds for any queue (offsets are below 2**63).
SEARCH_PROBES = 16
SEARCH_MAX_ROUNDS = 24
# Attempts of a lookup that a consume queue truncation or deletion overlapped.
CHANGED_RETRIES = 3
# QueryIndex reads candidates in batches of this many, and of at most this many record
# bytes (the whole messages are read back to check their keys: 256 of 4 MiB would be
# 1 GiB held at once), stopping once it has enough hits.
VERIFY_BATCH = 256
VERIFY_BATCH_BYTES = 32 << 20


class LookupFailedError(Exception):
    """A lookup that could not complete (the service answers UNAVAILABLE)."""


@dataclass(frozen=True, slots=True)
class Located:
    """An index candidate found in one of its topic's consume queues."""

    entry: Entry
    queue_id: int


# -- SearchOffset -------------------------------------------------------------------
async def search_offset(
    queue: ConsumeQueue, timestamp_ms: int, read: ReadFn, off_loop: OffLoop
) -> int:
    """The first queue offset (PRE_BLANK entries skipped) whose message was stored at or
    after ``timestamp_ms``; the queue's max offset if there is none.

    A k-ary search: each round reads SEARCH_PROBES evenly spaced entries' messages in one
    Read call. Store times are taken to be non-decreasing in queue order (as RocketMQ
    does). A message the storage already deleted (retention) counts as older. Each
    round's consume-queue reads run through ``off_loop``.
    """
    for attempt in range(CHANGED_RETRIES):
        try:
            return await _search_offset(queue, timestamp_ms, read, off_loop)
        except ConsumeQueueChangedError:
            if attempt == CHANGED_RETRIES - 1:
                raise LookupFailedError(
                    f"consume queue {queue.name} kept changing during the search; retry"
                ) from None
    raise AssertionError("unreachable")


async def _search_offset(
    queue: ConsumeQueue, timestamp_ms: int, read: ReadFn, off_loop: OffLoop
) -> int:
    lo, hi = queue.min_offset, queue.max_offset
    # Invariants: the answer is the first satisfying real entry in [lo, hi), else
    # ``answer``; no real entry lies in [hi, answer).
    answer = hi
    for _ in range(SEARCH_MAX_ROUNDS):
        if lo >= hi:
            return answer
        probes, hi = await off_loop(functools.partial(_probes, queue, lo, hi))
        if not probes:
            return answer
        results = await read([(e.commitlog_offset, e.size) for _, e in probes])
        first = next(
            (i for i, r in enumerate(results) if _at_or_after(r, timestamp_ms, probes[i][1])),
            None,
        )
        if first is None:
            lo = probes[-1][1].queue_offset + 1
            continue
        point, entry = probes[first]
        answer, hi = entry.queue_offset, point  # [point, entry) holds only PRE_BLANKs
        if first > 0:
            lo = probes[first - 1][1].queue_offset + 1
    raise LookupFailedError(
        f"search in consume queue {queue.name} did not converge in {SEARCH_MAX_ROUNDS} rounds"
    )


def _probes(queue: ConsumeQueue, lo: int, hi: int) -> Probes:
    """SEARCH_PROBES evenly spaced points of ``[lo, hi)``, each mapped to the first real
    entry at or after it; ``hi`` lowered to a point with no real entry from there."""
    points = sorted({lo + (hi - lo) * i // SEARCH_PROBES for i in range(SEARCH_PROBES)})
    probes: list[tuple[int, Entry]] = []
    for point in points:
        entry = _next_real(queue, point, hi)
        if entry is None:  # no real entry in [point, hi)
            return probes, point
        if not probes or probes[-1][1].queue_offset != entry.queue_offset:
            probes.append((point, entry))
    return probes, hi


def _next_real(queue: ConsumeQueue, offset: int, end: int) -> Entry | None:
    """The first entry at or after ``offset`` (below ``end``) that is not a PRE_BLANK."""
    entry = queue.entry_at(offset)
    if entry is not None and not entry.is_pre_blank:
        return entry
    found = queue.search_first(lambda e: e.queue_offset >= offset)
    if found is None or found >= end:
        return None
    entry = queue.entry_at(found)
    if entry is None or entry.is_pre_blank:
        raise ConsumeQueueChangedError(f"consume queue {queue.name} changed at {found}")
    return entry


def _at_or_after(result: pb.ReadResult, timestamp_ms: int, entry: Entry) -> bool:
    if result.status == pb.FOUND:
        return result.message.store_timestamp_ms >= timestamp_ms
    if result.status == pb.OFFSET_BELOW_MIN:
        return False  # deleted by retention: older than anything still there
    if result.status == pb.OFFSET_ABOVE_MAX:
        return True  # the storage's tail was cut; the entry is about to be dropped
    raise LookupFailedError(
        f"consume queue entry {entry.queue_offset} points at commitlog offset "
        f"{entry.commitlog_offset} (size {entry.size}), which the storage says is "
        f"{pb.ReadStatus.Name(result.status)}; retry"
    )


# -- QueryIndex ---------------------------------------------------------------------
def locate(queues: ConsumeQueueStore, topic: str, offsets: Sequence[int]) -> list[Located | None]:
    """For each commitlog offset, the consume queue entry of ``topic`` pointing at it
    (which gives the record's size), or None. A binary search per queue of the topic:
    entries are in commitlog order within a queue. Blocking: run it in a thread."""
    topic_queues = [
        queue
        for queue_id in queues.topics().get(topic, [])
        if (queue := queues.find(topic, queue_id)) is not None
    ]
    return [_locate_one(topic_queues, offset) for offset in offsets]


def _locate_one(topic_queues: Sequence[ConsumeQueue], offset: int) -> Located | None:
    for queue in topic_queues:
        for _ in range(CHANGED_RETRIES):
            try:
                found = queue.search_first(lambda e: e.commitlog_offset >= offset)
            except ConsumeQueueChangedError:
                continue
            if found is not None:
                entry = queue.entry_at(found)
                if entry is not None and entry.commitlog_offset == offset:
                    return Located(entry, queue.queue_id)
            break
    return None


def verify_batches(found: Sequence[Located]) -> Iterator[Sequence[Located]]:
    """``found`` in runs of at most VERIFY_BATCH entries and VERIFY_BATCH_BYTES record
    bytes (at least one entry each)."""
    start = total = 0
    for index, item in enumerate(found):
        size = item.entry.size
        if index > start and (index - start >= VERIFY_BATCH or total + size > VERIFY_BATCH_BYTES):
            yield found[start:index]
            start, total = index, 0
        total += size
    if start < len(found):
        yield found[start:]


def key_matches(message: pb.StoredMessage, topic: str, key: str) -> bool:
    """The message really carries ``key`` (a KEYS key, or its UNIQ_KEY) in ``topic``:
    index hits share hashes, so every candidate is checked."""
    if message.topic != topic:
        return False
    return key in message.keys or message.properties.get(UNIQ_KEY) == key

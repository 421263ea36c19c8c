"""ArrivedEntries (arrived_entries.py): the records arrival notices carried, sliced for
pulls as GetQueueEntries selects them (count and byte limits, at least one record), and
dropped when they may no longer be the queue's. Pure: notices built here, records of
random sizes in spans of random lengths."""

from __future__ import annotations

import random

from services.gateway.arrived_entries import ArrivedEntries
from tide.v1 import dispatch_pb2 as dispatch_pb

KEY = ("dispatch:1", "T", 0)
MIB = 1 << 20


def record(offset: int, body_bytes: int) -> bytes:
    """A stand-in record: its 4-byte big-endian total size first, as a stored record."""
    body = b"%d|" % offset + b"x" * body_bytes
    return (len(body) + 4).to_bytes(4, "big") + body


def notice(
    since: int, records: list[bytes], span_counts: list[int], *, max_offset: int = 0
) -> dispatch_pb.ArrivalNotice:
    """A notice carrying ``records`` (entries from ``since``) in spans of these counts."""
    end = since + len(records)
    entries = dispatch_pb.GetQueueEntriesResponse(
        next_offset=end, min_offset=0, max_offset=max(end, max_offset), records=b"".join(records)
    )
    first = 0
    for count in span_counts:
        size = sum(len(r) for r in records[first : first + count])
        entries.spans.add(physical_offset=first * 1000, size=size, count=count)
        first += count
    assert first == len(records)
    return dispatch_pb.ArrivalNotice(
        topic=KEY[1],
        queue_id=KEY[2],
        max_offset=max(end, max_offset),
        entries_offset=since,
        entries=entries,
    )


def random_spans(rng: random.Random, count: int) -> list[int]:
    spans = []
    while count:
        spans.append(rng.randint(1, count))
        count -= spans[-1]
    return spans


def expected(records: list[bytes], offset: int, max_count: int, max_bytes: int) -> list[bytes]:
    """What GetQueueEntries selects: up to max_count, stopping before the record that
    would pass max_bytes, one at least."""
    taken: list[bytes] = []
    size = 0
    for item in records[offset:]:
        if len(taken) == max_count or (taken and size + len(item) > max_bytes):
            break
        taken.append(item)
        size += len(item)
    return taken


def test_pulls_get_what_get_queue_entries_would_select() -> None:
    rng = random.Random(21)
    kept = ArrivedEntries(max_queue_bytes=MIB, max_total_bytes=64 * MIB)
    records: list[bytes] = []
    for _ in range(30):
        since = len(records)
        batch = [record(since + i, rng.randint(0, 60)) for i in range(rng.randint(1, 20))]
        kept.add(KEY, notice(since, batch, random_spans(rng, len(batch))))
        records += batch
    for _ in range(2000):
        offset = rng.randrange(len(records))
        max_count, max_bytes = rng.randint(1, 40), rng.randint(1, 900)
        answer = kept.take(KEY, offset, max_count, max_bytes)
        want = expected(records, offset, max_count, max_bytes)
        assert answer is not None
        assert answer.records == b"".join(want)
        assert (answer.count, answer.next_offset) == (len(want), offset + len(want))
        assert answer.max_offset == len(records)
    assert kept.take(KEY, len(records), 10, MIB) is None  # the end: nothing kept there
    assert kept.take(("dispatch:2", "T", 0), 0, 10, MIB) is None


def test_a_gap_replaces_the_run_and_a_lower_max_drops_it() -> None:
    kept = ArrivedEntries(max_queue_bytes=MIB, max_total_bytes=64 * MIB)
    kept.add(KEY, notice(0, [record(0, 5), record(1, 5)], [2]))
    kept.add(KEY, notice(5, [record(5, 5)], [1]))  # not where the run ended
    assert kept.take(KEY, 0, 10, MIB) is None
    answer = kept.take(KEY, 5, 10, MIB)
    assert answer is not None and answer.next_offset == 6
    # Offsets only, growing: kept (the max moves); lower than the run's end: dropped.
    kept.add(KEY, dispatch_pb.ArrivalNotice(topic="T", queue_id=0, max_offset=9))
    answer = kept.take(KEY, 5, 10, MIB)
    assert answer is not None and answer.max_offset == 9
    kept.add(KEY, dispatch_pb.ArrivalNotice(topic="T", queue_id=0, max_offset=5))
    assert kept.take(KEY, 5, 10, MIB) is None
    assert kept.held_bytes == 0


def test_inconsistent_entries_are_not_kept() -> None:
    kept = ArrivedEntries(max_queue_bytes=MIB, max_total_bytes=64 * MIB)
    bad = notice(0, [record(0, 5), record(1, 5)], [2])
    bad.entries.spans[0].count = 3  # counts more entries than the notice covers
    kept.add(KEY, bad)
    assert kept.take(KEY, 0, 10, MIB) is None and kept.held_bytes == 0


def test_the_bounds_hold() -> None:
    per_record = len(record(0, 100))
    kept = ArrivedEntries(max_queue_bytes=3 * per_record, max_total_bytes=5 * per_record)
    for offset in range(4):
        kept.add(KEY, notice(offset, [record(offset, 100)], [1]))
    assert kept.take(KEY, 0, 10, MIB) is None  # the oldest part went
    answer = kept.take(KEY, 1, 10, MIB)
    assert answer is not None and answer.count == 3
    other = ("dispatch:1", "T", 1)
    kept.add(other, notice(0, [record(0, 100), record(1, 100)], [2]))
    assert kept.held_bytes == 5 * per_record
    kept.add(other, notice(2, [record(2, 100)], [1]))  # past the total: all dropped
    assert kept.held_bytes == 0 and kept.take(KEY, 1, 10, MIB) is None


def test_a_broken_watch_forgets_its_dispatch() -> None:
    kept = ArrivedEntries(max_queue_bytes=MIB, max_total_bytes=64 * MIB)
    other = ("dispatch:2", "T", 0)
    kept.add(KEY, notice(0, [record(0, 5)], [1]))
    kept.add(other, notice(0, [record(0, 5)], [1]))
    kept.forget_address("dispatch:1")
    assert kept.take(KEY, 0, 10, MIB) is None
    assert kept.take(other, 0, 10, MIB) is not None

"""GetQueueEntries' ``max_bytes`` and ``spans``: the pure selection and grouping
(tide/format/_entry_spans.py, over packed entries), then against real storage and
dispatch processes over gRPC, unary and on GetQueueEntriesStream. Spans are checked
against the ``entries`` answer to the same request: same records, same count and
bytes, grouped where adjacent."""

from __future__ import annotations

import asyncio
import itertools
import random
from functools import partial

import grpc
import pytest

from services.dispatch.engine.consume_queue import Entry
from services.dispatch.servicer import _add_entries
from tests.services.dispatch.conftest import RPC_TIMEOUT_S, Pair
from tests.services.dispatch.test_entries_stream import exchange
from tests.services.storage.conftest import expect_error, message
from tide.format import PRE_BLANK_SIZE, Span, Spans, pack_entries, select_spans, tags_code
from tide.v1 import dispatch_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NO_CODES: frozenset[int] = frozenset()
# An entry as (commitlog_offset, size, tags_code); a PRE_BLANK is (0, PRE_BLANK_SIZE, 0).
Unit = tuple[int, int, int]
PRE_BLANK: Unit = (0, PRE_BLANK_SIZE, 0)


# -- select_spans: the pure function ---------------------------------------------------
def select(
    units: list[Unit],
    first_offset: int,
    max_count: int,
    codes: frozenset[int],
    max_bytes: int,
    next_offset: int,
) -> Spans:
    """select_spans over ``units`` packed as ConsumeQueue.get_bytes returns them."""
    columns = [list(column) for column in zip(*units, strict=True)] or [[], [], []]
    entries = pack_entries(*columns)
    return select_spans(entries, first_offset, max_count, codes, max_bytes, next_offset)


def run(
    sizes: list[int],
    gaps: tuple[int, ...] = (),
    max_count: int = 1024,
    codes: frozenset[int] = NO_CODES,
    max_bytes: int = 0,
) -> Spans:
    """select_spans over entries 10.. of the given record sizes, back to back from
    commitlog offset 1000 except for a 7-byte gap before each index in ``gaps``; entry
    ``i``'s tags code is ``i % 3``."""
    units: list[Unit] = []
    position = 1000
    for index, size in enumerate(sizes):
        position += 7 if index in gaps else 0
        units.append((position, size, index % 3))
        position += size
    return select(units, 10, max_count, codes, max_bytes, 10)


def test_adjacent_records_make_one_span_and_gaps_start_new_ones() -> None:
    assert run([100, 200, 300]) == ([(1000, 600, 3)], 13)
    assert run([100, 200, 300, 50], gaps=(2,)) == ([(1000, 300, 2), (1307, 350, 2)], 14)
    assert run([100, 200], gaps=(1,)) == ([(1000, 100, 1), (1107, 200, 1)], 12)


def test_nothing_looked_at_keeps_the_offset() -> None:
    assert select([], 42, 32, NO_CODES, 0, 42) == ([], 42)


def test_max_count_counts_the_taken_entries() -> None:
    assert run([100] * 10, max_count=4) == ([(1000, 400, 4)], 14)
    # With a filter, skipped entries do not count (codes: 0 1 2 0 1 2 ...).
    assert run([100] * 10, max_count=2, codes=frozenset({0})) == (
        [(1000, 100, 1), (1300, 100, 1)],
        14,
    )


def test_skipped_entries_break_spans_but_advance_the_offset() -> None:
    # Entries 10..15, codes 0 1 2 0 1 2: code 2 skipped, so 12 and 15 are holes.
    spans = run([10, 20, 30, 40, 50, 60], codes=frozenset({0, 1}))
    assert spans == ([(1000, 30, 2), (1060, 90, 2)], 16)
    # Only skipped entries at the end: the offset still moves past them.
    assert run([10, 20, 30], codes=frozenset({5})) == ([], 13)


def test_pre_blank_entries_are_skipped() -> None:
    units = [PRE_BLANK, PRE_BLANK, (500, 80, 0)]
    assert select(units, 0, 32, NO_CODES, 0, 0) == ([(500, 80, 1)], 3)
    assert select(units[:2], 0, 32, NO_CODES, 0, 0) == ([], 2)
    # Queue offsets count from first_offset.
    assert select(units, 40, 32, NO_CODES, 0, 40) == ([(500, 80, 1)], 43)
    # Only (0, PRE_BLANK_SIZE, 0) is a PRE_BLANK (Entry.is_pre_blank), whatever its size.
    odd = [(0, PRE_BLANK_SIZE, 1), (7, PRE_BLANK_SIZE, 0)]
    assert select(odd, 0, 32, NO_CODES, 0, 0) == (
        [(0, PRE_BLANK_SIZE, 1), (7, PRE_BLANK_SIZE, 1)],
        2,
    )


def test_select_agrees_with_the_entries_answer() -> None:
    """select_spans over units gives what the entries path (_add_entries, over Entry
    objects) selects, grouped, on random queues with PRE_BLANKs, gaps, tags and limits."""
    rng = random.Random(11)
    for _ in range(300):
        first, position = rng.randrange(100), 0
        units: list[Unit] = []
        for _ in range(rng.randrange(40)):
            if rng.random() < 0.1:
                units.append(PRE_BLANK)
                continue
            position += rng.choice((0, 0, 0, 5))
            size = rng.randrange(1, 300)
            units.append((position, size, rng.randrange(4)))
            position += size
        max_count = rng.randrange(1, 50)
        codes = frozenset(rng.sample(range(4), rng.randrange(3)))
        max_bytes = rng.choice((0, rng.randrange(1, 2000)))
        response = pb.GetQueueEntriesResponse(next_offset=first)
        entries = [Entry(first + i, *unit) for i, unit in enumerate(units)]
        expected = _add_entries(response, entries, max_count, codes, max_bytes)
        spans, next_offset = select(units, first, max_count, codes, max_bytes, first)
        assert next_offset == expected
        assert spans == grouped(list(response.entries))


def test_select_max_bytes_stops_before_the_entry_past_it() -> None:
    sizes = [100, 200, 300, 400]
    assert run(sizes, max_bytes=600) == ([(1000, 600, 3)], 13)  # exactly 600: taken
    assert run(sizes, max_bytes=599) == ([(1000, 300, 2)], 12)
    assert run(sizes, max_bytes=10_000) == ([(1000, 1000, 4)], 14)
    # Skipped entries' records do not count (codes 0 1 2 0: entry 12 skipped).
    assert run(sizes, codes=frozenset({0, 1}), max_bytes=700) == (
        [(1000, 300, 2), (1600, 400, 1)],
        14,
    )
    assert run(sizes, codes=frozenset({0, 1}), max_bytes=699) == ([(1000, 300, 2)], 13)
    assert run(sizes, codes=frozenset({0, 1}), max_bytes=299) == ([(1000, 100, 1)], 11)


def test_select_takes_the_first_entry_even_past_max_bytes() -> None:
    assert run([500, 10], max_bytes=1) == ([(1000, 500, 1)], 11)
    # The first entry taken, not looked at: after skipped ones.
    # (codes 0 1 2 0 1 2: entries 12 and 15 have code 2.)
    assert run([5, 5, 500, 10, 10, 10], codes=frozenset({2}), max_bytes=1) == (
        [(1010, 500, 1)],
        15,
    )


# -- against real processes --------------------------------------------------------------
def append_dispatched(
    pair: Pair, batches: list[list[storage_pb.Message]]
) -> list[storage_pb.AppendResult]:
    """Append each batch (at most 10 messages, the shared storage's limit) in one call and
    wait until all are dispatched."""
    results: list[storage_pb.AppendResult] = []
    for batch in batches:
        results += pair.storage.append(batch)
    pair.dispatch.wait_dispatched(pair.storage.status().max_offset)
    return results


def request(
    topic: str,
    queue_id: int = 0,
    *,
    offset: int = 0,
    max_count: int = 1024,
    tag_codes: tuple[int, ...] = (),
    max_bytes: int = 0,
    spans: bool = False,
) -> pb.GetQueueEntriesRequest:
    return pb.GetQueueEntriesRequest(
        topic=topic,
        queue_id=queue_id,
        offset=offset,
        max_count=max_count,
        tag_codes=tag_codes,
        max_bytes=max_bytes,
        spans=spans,
    )


def get(pair: Pair, req: pb.GetQueueEntriesRequest) -> pb.GetQueueEntriesResponse:
    return pair.dispatch.stub.GetQueueEntries(req, timeout=RPC_TIMEOUT_S)


def spans_of(response: pb.GetQueueEntriesResponse) -> list[Span]:
    return [(s.physical_offset, s.size, s.count) for s in response.spans]


def grouped(entries: list[pb.QueueEntry]) -> list[Span]:
    """The spans expected for ``entries``: each starts a new span unless its record
    begins where the previous span's records end."""
    spans: list[Span] = []
    for entry in entries:
        if spans and spans[-1][0] + spans[-1][1] == entry.physical_offset:
            start, size, count = spans[-1]
            spans[-1] = (start, size + entry.size, count + 1)
        else:
            spans.append((entry.physical_offset, entry.size, 1))
    return spans


def both(
    pair: Pair, req: pb.GetQueueEntriesRequest
) -> tuple[pb.GetQueueEntriesResponse, pb.GetQueueEntriesResponse]:
    """The answers to ``req`` as entries and as spans, checked to agree: the same
    offsets, no entries in the spans answer, and spans covering exactly the entries'
    records (count, bytes, first offset, grouping)."""
    as_entries = pb.GetQueueEntriesRequest()
    as_entries.CopyFrom(req)
    as_entries.spans = False
    as_spans = pb.GetQueueEntriesRequest()
    as_spans.CopyFrom(req)
    as_spans.spans = True
    entries, spans = get(pair, as_entries), get(pair, as_spans)
    assert not entries.spans and not spans.entries
    assert (spans.next_offset, spans.min_offset, spans.max_offset) == (
        entries.next_offset,
        entries.min_offset,
        entries.max_offset,
    )
    assert sum(s.count for s in spans.spans) == len(entries.entries)
    assert sum(s.size for s in spans.spans) == sum(e.size for e in entries.entries)
    if entries.entries:
        assert spans.spans[0].physical_offset == entries.entries[0].physical_offset
    assert spans_of(spans) == grouped(list(entries.entries))
    return entries, spans


def test_one_batch_to_one_queue_is_one_span(shared_pair: Pair, topic_name: str) -> None:
    batch = [message(topic_name, 0, b"x" * (10 * i)) for i in range(10)]
    results = append_dispatched(shared_pair, [batch])
    first = results[0].physical_offset
    for before, after in itertools.pairwise(results):  # stored back to back
        assert before.physical_offset + before.size == after.physical_offset
    entries, spans = both(shared_pair, request(topic_name))
    total = sum(r.size for r in results)
    assert spans_of(spans) == [(first, total, 10)]
    assert spans.next_offset == 10 and len(entries.entries) == 10
    # From an offset inside the batch, and a page of max_count.
    _, page = both(shared_pair, request(topic_name, offset=3, max_count=4))
    assert spans_of(page) == [(results[3].physical_offset, sum(r.size for r in results[3:7]), 4)]
    assert page.next_offset == 7
    # At the max offset: nothing, not an error.
    _, empty = both(shared_pair, request(topic_name, offset=10))
    assert not empty.spans and empty.next_offset == 10


def test_interleaved_queues_make_a_span_per_run(shared_pair: Pair, topic_name: str) -> None:
    queues = [0, 0, 0, 1, 1, 0, 1, 0, 1, 0]
    batch = [message(topic_name, q, f"m{i}".encode()) for i, q in enumerate(queues)]
    results = append_dispatched(shared_pair, [batch, batch])
    by_queue = {
        q: [r for r, rq in zip(results, queues * 2, strict=True) if rq == q] for q in (0, 1)
    }

    _, zero = both(shared_pair, request(topic_name, 0))
    # Runs of queue 0 in the two batches (one after the other in the commitlog: the last
    # of the first and the first three of the second are one run).
    assert [s.count for s in zero.spans] == [3, 1, 1, 4, 1, 1, 1]
    assert zero.spans[0].physical_offset == by_queue[0][0].physical_offset
    assert sum(s.size for s in zero.spans) == sum(r.size for r in by_queue[0])

    _, one = both(shared_pair, request(topic_name, 1))
    assert [s.count for s in one.spans] == [2, 1, 1, 2, 1, 1]
    assert sum(s.count for s in one.spans) == len(by_queue[1]) == one.next_offset == 8


def test_max_bytes_stops_before_the_entry_past_it(shared_pair: Pair, topic_name: str) -> None:
    batch = [message(topic_name, 0, b"y" * (100 * (i + 1))) for i in range(8)]
    results = append_dispatched(shared_pair, [batch])
    sizes = [r.size for r in results]
    first_three = sum(sizes[:3])
    for max_bytes in (first_three, first_three + sizes[3] - 1):
        entries, spans = both(shared_pair, request(topic_name, max_bytes=max_bytes))
        assert [e.queue_offset for e in entries.entries] == [0, 1, 2]
        assert entries.next_offset == 3  # the entry that did not fit comes next time
        assert spans_of(spans) == [(results[0].physical_offset, first_three, 3)]
    # From an offset: the limit counts from the first entry returned.
    entries, _ = both(shared_pair, request(topic_name, offset=5, max_bytes=sizes[5] + sizes[6]))
    assert [e.queue_offset for e in entries.entries] == [5, 6] and entries.next_offset == 7
    # max_count still applies under the byte limit; 0 is no limit.
    entries, _ = both(shared_pair, request(topic_name, max_count=2, max_bytes=10**9))
    assert len(entries.entries) == 2 and entries.next_offset == 2
    entries, _ = both(shared_pair, request(topic_name, max_bytes=0))
    assert len(entries.entries) == 8 and entries.next_offset == 8


def test_the_first_entry_comes_even_past_max_bytes(shared_pair: Pair, topic_name: str) -> None:
    results = append_dispatched(shared_pair, [[message(topic_name, 0, b"z" * 5000)] * 3])
    for offset in (0, 2):
        entries, spans = both(shared_pair, request(topic_name, offset=offset, max_bytes=1))
        assert [e.queue_offset for e in entries.entries] == [offset]
        assert entries.next_offset == offset + 1
        assert spans_of(spans) == [(results[offset].physical_offset, results[offset].size, 1)]


def test_paging_by_max_bytes_returns_every_entry_once(shared_pair: Pair, topic_name: str) -> None:
    batches = [
        [message(topic_name, 0, b"p" * (37 * i + j + 1)) for j in range(10)] for i in range(3)
    ]
    results = append_dispatched(shared_pair, batches)
    sizes = [r.size for r in results]
    limit = 3 * max(sizes) - 1  # 2 or more entries a page
    offset, seen = 0, []
    while offset < len(results):
        entries, spans = both(shared_pair, request(topic_name, offset=offset, max_bytes=limit))
        taken = sum(s.size for s in spans.spans)
        next_offset = entries.next_offset
        assert len(entries.entries) >= min(2, len(results) - offset)
        assert taken <= limit
        assert next_offset == len(results) or taken + sizes[next_offset] > limit
        seen += [(e.physical_offset, e.size) for e in entries.entries]
        offset = next_offset
    assert seen == [(r.physical_offset, r.size) for r in results]


def test_tag_filter_with_spans(shared_pair: Pair, topic_name: str) -> None:
    tags = ["A", "A", "B", "A", "A", "A", "C", "B", "A", "A"]
    batch = [message(topic_name, 0, tags=t) for t in tags]
    results = append_dispatched(shared_pair, [batch])
    code_a = tags_code("A")

    def run_of(first: int, count: int) -> Span:
        return (
            results[first].physical_offset,
            sum(r.size for r in results[first : first + count]),
            count,
        )

    entries, spans = both(shared_pair, request(topic_name, tag_codes=(code_a,)))
    assert [e.queue_offset for e in entries.entries] == [0, 1, 3, 4, 5, 8, 9]
    # The filtered-out records lie between: each breaks the run.
    assert spans_of(spans) == [run_of(0, 2), run_of(3, 3), run_of(8, 2)]
    assert spans.next_offset == 10
    # B or C: 6 and 7 adjacent, 2 alone.
    _, b_or_c = both(shared_pair, request(topic_name, tag_codes=(tags_code("B"), tags_code("C"))))
    assert spans_of(b_or_c) == [run_of(2, 1), run_of(6, 2)]
    # With a byte limit: only taken records count, next_offset is the one that did not fit.
    limit = sum(r.size for r in results[:2]) + results[3].size
    _, cut = both(shared_pair, request(topic_name, tag_codes=(code_a,), max_bytes=limit))
    assert spans_of(cut) == [run_of(0, 2), run_of(3, 1)] and cut.next_offset == 4
    # Nothing matches: no spans, the offset still moves past what was looked at.
    _, none = both(shared_pair, request(topic_name, tag_codes=(tags_code("nope"),)))
    assert not none.spans and none.next_offset == 10


def test_negative_max_bytes_is_invalid(shared_pair: Pair, topic_name: str) -> None:
    append_dispatched(shared_pair, [[message(topic_name, 0)]])
    for spans in (False, True):
        req = request(topic_name, max_bytes=-1, spans=spans)
        expect_error(INVALID, partial(get, shared_pair, req), "max_bytes", "-1")
    answer = asyncio.run(exchange(shared_pair.dispatch.listen, [request(topic_name, max_bytes=-5)]))
    assert answer[0].error_code == INVALID.value[0]
    assert "max_bytes" in answer[0].error_message


def test_stream_answers_spans_like_the_unary_call(shared_pair: Pair, topic_name: str) -> None:
    queues = [0, 1, 0, 0, 1, 0, 0, 0, 1, 0]
    batch = [
        message(topic_name, q, b"s" * (i * 50 + 1), tags="AB"[i % 2]) for i, q in enumerate(queues)
    ]
    results = append_dispatched(shared_pair, [batch])
    requests = [
        request(topic_name, 0, spans=True),
        request(topic_name, 0, offset=1, max_count=3, spans=True),
        request(topic_name, 0, max_bytes=results[0].size + results[2].size, spans=True),
        request(topic_name, 0, tag_codes=(tags_code("A"),), spans=True),
        request(topic_name, 0, max_bytes=-1, spans=True),
        request(topic_name, 1, spans=True, max_bytes=1),
    ]
    answers = asyncio.run(exchange(shared_pair.dispatch.listen, requests))
    for req, answer in zip(requests, answers, strict=True):
        if req.max_bytes < 0:
            assert answer.error_code == INVALID.value[0]
            continue
        assert not answer.error_code, answer.error_message
        assert answer.response == both(shared_pair, req)[1]
    spans = [spans_of(a.response) for a in answers]
    assert [sum(s[2] for s in x) for x in spans] == [7, 3, 2, 3, 0, 1]
    assert spans[2] == [(r.physical_offset, r.size, 1) for r in (results[0], results[2])]


@pytest.mark.parametrize("max_count", [1, 5, 1024])
def test_without_the_new_fields_entries_are_unchanged(
    shared_pair: Pair, topic_name: str, max_count: int
) -> None:
    batch = [message(topic_name, 0, tags="T") for _ in range(6)]
    results = append_dispatched(shared_pair, [batch])
    plain = get(shared_pair, request(topic_name, max_count=max_count))
    expected = [
        pb.QueueEntry(
            queue_offset=r.queue_offset,
            physical_offset=r.physical_offset,
            size=r.size,
            tags_code=tags_code("T"),
        )
        for r in results[:max_count]
    ]
    assert list(plain.entries) == expected and not plain.spans
    assert plain.next_offset == min(max_count, 6)

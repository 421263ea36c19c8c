"""WatchArrivals with ``entries_max_count``: a notice carries the queue's entries from the
max offset the watch announced before (GetQueueEntries' answer with spans and records)
when a records reader keeps up there (it read the queue to its end at that offset or
before, lately), against real storage and dispatch processes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, cast

import grpc
import pytest

from services.dispatch import servicer as servicer_module
from services.dispatch.arrivals import ArrivalHub
from services.dispatch.servicer import DispatchServicer, Running
from tests.services.dispatch.conftest import RPC_TIMEOUT_S, DispatchProcess, Pair
from tests.services.dispatch.test_tail_cache import spans_request, storage_records
from tests.services.storage.conftest import cancel, expect_error, message
from tide.v1 import dispatch_pb2 as pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def watch(
    dispatch: DispatchProcess, topic: str, **fields: Any
) -> grpc.CallIterator[pb.ArrivalNotice]:
    request = pb.WatchArrivalsRequest(topics=[topic], send_current=True, **fields)
    return dispatch.stub.WatchArrivals(request, timeout=RPC_TIMEOUT_S)


def notices_until(
    notices: Iterator[pb.ArrivalNotice], queue_id: int, max_offset: int
) -> list[pb.ArrivalNotice]:
    """Notices of ``queue_id`` until one reaches ``max_offset``."""
    seen = []
    for notice in notices:
        if notice.queue_id == queue_id:
            seen.append(notice)
            if notice.max_offset >= max_offset:
                return seen
    pytest.fail(f"the watch ended before queue {queue_id} reached {max_offset}: {seen}")


def wait_at(pair: Pair, topic: str, offset: int, queue_id: int = 0) -> None:
    """Read the queue's records at its end, as a gateway does before it holds a pull."""
    answer = pair.dispatch.stub.GetQueueEntries(
        spans_request(topic, queue_id, offset=offset), timeout=RPC_TIMEOUT_S
    )
    assert (answer.max_offset, list(answer.spans)) == (offset, [])


def check_entries(pair: Pair, notice: pb.ArrivalNotice, since: int) -> None:
    """The notice carries GetQueueEntries' answer from ``since``: the same spans, and
    the records the storage holds for them."""
    assert notice.HasField("entries"), notice
    assert notice.entries_offset == since
    entries = notice.entries
    assert entries.spans and not entries.entries
    assert entries.records == storage_records(pair, entries)
    assert sum(span.count for span in entries.spans) == entries.next_offset - since
    assert since < notice.max_offset <= entries.next_offset <= entries.max_offset


def test_notices_carry_the_entries_since_the_previous_one(
    shared_pair: Pair, topic_name: str
) -> None:
    pair = shared_pair
    pair.storage.append([message(topic_name, 0, b"before")])
    pair.dispatch.wait_dispatched(pair.storage.status().max_offset)
    call = watch(pair.dispatch, topic_name, entries_max_count=1024)
    notices = iter(call)
    try:
        current = next(notices)  # the queue as it was: nothing announced before it
        assert (current.queue_id, current.max_offset) == (0, 1)
        assert not current.HasField("entries") and current.entries_offset == 0
        since = 1
        for round_ in range(3):
            wait_at(pair, topic_name, since)
            bodies = [f"r{round_}-{i}".encode() * (i + 1) for i in range(round_ + 2)]
            pair.storage.append([message(topic_name, 0, body) for body in bodies])
            (notice,) = notices_until(notices, 0, since + len(bodies))
            check_entries(pair, notice, since)
            since = notice.max_offset
        # A queue the watch never announced: its first notice has no entries.
        pair.storage.append([message(topic_name, 1, b"new queue")])
        (first,) = notices_until(notices, 1, 1)
        assert not first.HasField("entries")
        wait_at(pair, topic_name, 1, queue_id=1)
        pair.storage.append([message(topic_name, 1, b"second")])
        (second,) = notices_until(notices, 1, 2)
        check_entries(pair, second, 1)
    finally:
        cancel(call)


def test_notices_carry_entries_only_where_a_reader_waits(
    shared_pair: Pair, topic_name: str
) -> None:
    """No reader found the queue empty, one reads behind, one waits at another offset, a
    tag-filtered reader waits: no entries. A reader waiting at the announced offset: them."""
    pair = shared_pair
    pair.storage.append([message(topic_name, 0, b"x")])
    pair.dispatch.wait_dispatched(pair.storage.status().max_offset)
    call = watch(pair.dispatch, topic_name, entries_max_count=1024)
    notices = iter(call)
    stub = pair.dispatch.stub
    try:
        assert next(notices).max_offset == 1
        pair.storage.append([message(topic_name, 0, b"nobody waits")])
        (alone,) = notices_until(notices, 0, 2)
        assert not alone.HasField("entries")
        wait_at(pair, topic_name, 2)
        # ...then a reader reads behind (from offset 0, one entry: short of the end): it
        # is not waiting.
        behind = stub.GetQueueEntries(spans_request(topic_name, max_count=1), timeout=RPC_TIMEOUT_S)
        assert behind.spans and behind.next_offset < behind.max_offset
        pair.storage.append([message(topic_name, 0, b"read behind")])
        (after_behind,) = notices_until(notices, 0, 3)
        assert not after_behind.HasField("entries")
        tagged = spans_request(topic_name, offset=3, tag_codes=[7])
        assert not stub.GetQueueEntries(tagged, timeout=RPC_TIMEOUT_S).spans
        pair.storage.append([message(topic_name, 0, b"tag filter")])
        (after_tagged,) = notices_until(notices, 0, 4)
        assert not after_tagged.HasField("entries")
        wait_at(pair, topic_name, 4)
        pair.storage.append([message(topic_name, 0, b"waited for")])
        (waited,) = notices_until(notices, 0, 5)
        check_entries(pair, waited, 4)
    finally:
        cancel(call)


def test_notice_entries_keep_the_limits(shared_pair: Pair, topic_name: str) -> None:
    pair = shared_pair
    pair.storage.append([message(topic_name, 0, b"x")])
    pair.dispatch.wait_dispatched(pair.storage.status().max_offset)
    wait_at(pair, topic_name, 1)
    calls = [
        watch(pair.dispatch, topic_name, entries_max_count=2),
        watch(pair.dispatch, topic_name, entries_max_count=1024, entries_max_bytes=1),
        watch(pair.dispatch, topic_name),
    ]
    by_count, by_bytes, without = (iter(call) for call in calls)
    try:
        for notices in (by_count, by_bytes, without):
            assert next(notices).max_offset == 1
        pair.storage.append([message(topic_name, 0, b"y" * 200) for _ in range(5)])
        (counted,) = notices_until(by_count, 0, 6)
        assert [s.count for s in counted.entries.spans] == [2]
        assert counted.entries.next_offset == 3
        assert counted.entries.records == storage_records(pair, counted.entries)
        (cut,) = notices_until(by_bytes, 0, 6)
        assert [s.count for s in cut.entries.spans] == [1]  # the first entry always
        assert cut.entries.next_offset == 2
        (plain,) = notices_until(without, 0, 6)
        assert not plain.HasField("entries")
        # What GetQueueEntries answers from there.
        asked = pair.dispatch.stub.GetQueueEntries(
            spans_request(topic_name, offset=1, max_count=2), timeout=RPC_TIMEOUT_S
        )
        assert list(asked.spans) == list(counted.entries.spans)
        assert asked.records == counted.entries.records
    finally:
        for call in calls:
            cancel(call)


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"entries_max_count": -1}, "entries_max_count must be in 0..1024"),
        ({"entries_max_count": 1025}, "entries_max_count must be in 0..1024"),
        ({"entries_max_count": 5, "entries_max_bytes": -1}, "entries_max_bytes must be >= 0"),
    ],
)
def test_bad_entry_limits_are_invalid(shared_pair: Pair, fields: dict[str, int], text: str) -> None:
    expect_error(INVALID, lambda: next(iter(watch(shared_pair.dispatch, "T", **fields))), text)


def test_waiting_readers_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_CAUGHT_UP_QUEUES queues (deleted topics' stay) they are forgotten at once;
    a queue read behind is forgotten on its own."""
    monkeypatch.setattr(servicer_module, "MAX_CAUGHT_UP_QUEUES", 3)
    servicer = DispatchServicer(lambda: cast(Running, None), ArrivalHub())
    try:
        for queue_id in range(3):
            servicer._note_caught_up("T", queue_id, 5, 5)
        servicer._note_caught_up("T", 2, 6, 6)  # known queue: no clearing
        assert _offsets(servicer) == {("T", 0): 5, ("T", 1): 5, ("T", 2): 6}
        servicer._note_caught_up("T", 1, 3, 6)  # read behind
        assert ("T", 1) not in servicer._caught_up
        servicer._note_caught_up("T", 1, 6, 6)
        servicer._note_caught_up("T", 9, 1, 1)  # a fourth: the others go
        assert _offsets(servicer) == {("T", 9): 1}
    finally:
        servicer._readers.shutdown(wait=True)


def _offsets(servicer: DispatchServicer) -> dict[tuple[str, int], int]:
    return {key: offset for key, (offset, _) in servicer._caught_up.items()}


def test_a_reader_that_kept_up_counts_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that read a queue to its end at an offset makes the notices from there
    or later carry entries, for CAUGHT_UP_S: a gateway answering its pulls from them
    does not read again to say it keeps up."""
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    servicer = DispatchServicer(lambda: cast(Running, None), ArrivalHub())
    try:
        key = ("T", 0)
        assert not servicer._reader_waits(key, 5)  # no reader yet
        servicer._note_caught_up("T", 0, 5, 5)
        assert servicer._reader_waits(key, 5)
        assert servicer._reader_waits(key, 9)  # its pulls answered from the notices since
        assert not servicer._reader_waits(key, 4)  # a notice from before where it read
        now[0] += servicer_module.CAUGHT_UP_S
        assert not servicer._reader_waits(key, 9)  # too long ago: it may be gone
        servicer._note_caught_up("T", 0, 9, 9)  # it read to the end again
        assert servicer._reader_waits(key, 9)
    finally:
        servicer._readers.shutdown(wait=True)

"""TailCache (services/dispatch/tail_cache.py): the newest records' bytes by commitlog
offset. Batches are built by hand over a made-up commitlog (``LOG``: byte ``i`` is at
offset ``i``), so every answer is checked against the commitlog bytes themselves; then
real batches from the Tail assembler (a blank marker, a record split across chunks).

Then GetQueueEntries' ``records`` against real storage and dispatch processes: the bytes
Storage/Read answers for the same spans, unary and on GetQueueEntriesStream; none with
the cache off, and after a restart only what was followed since."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from services.dispatch.arrivals import ArrivalHub
from services.dispatch.metrics import DispatchMetrics
from services.dispatch.servicer import Running
from services.dispatch.tail_cache import _COMPACT_MIN, RUN_OVERHEAD_BYTES, TailCache
from tests.services.dispatch.conftest import RPC_TIMEOUT_S, DispatchLauncher, Pair
from tests.services.dispatch.test_entries_stream import exchange
from tests.services.dispatch.test_entry_spans import append_dispatched, get
from tests.services.storage.conftest import StorageLauncher, message
from tests.tail.test_assembler import SEGMENT, record, records_from, segment_with_blank
from tide.format import tags_code
from tide.tail import RecordAssembler, RecordBatch
from tide.v1 import dispatch_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

LOG = random.Random(7).randbytes(1 << 16)
HEAD = b"HDR"  # bytes before the records in a batch's buffer (a Tail chunk's header)


def make_batch(
    data: bytes, positions: list[int], offsets: list[int], sizes: list[int]
) -> RecordBatch:
    zeros = [0] * len(offsets)
    return RecordBatch(
        data,
        positions=positions,
        offsets=offsets,
        sizes=sizes,
        queue_ids=zeros,
        queue_offsets=zeros,
        sys_flags=zeros,
        store_timestamps=zeros,
        topics=["t"] * len(offsets),
        props_starts=list(positions),
    )


def chunk(start: int, sizes: list[int]) -> RecordBatch:
    """Records of ``sizes`` back to back from ``start``, in one buffer after ``HEAD``."""
    end = start + sum(sizes)
    offsets = [start]
    for size in sizes[:-1]:
        offsets.append(offsets[-1] + size)
    positions = [offset - start + len(HEAD) for offset in offsets]
    return make_batch(HEAD + LOG[start:end], positions, offsets, sizes)


def got(cache: TailCache, offset: int, size: int) -> bytes | None:
    found = cache.get(offset, size)
    return None if found is None else bytes(found)


def joined(cache: TailCache, spans: list[tuple[int, int]], *, counted: bool = True) -> bytes | None:
    """The cache's records for ``spans``, joined (None when it does not hold them all)."""
    parts = cache.records(spans, counted=counted)
    return None if parts is None else b"".join(parts)


def test_a_range_inside_one_batch_is_served_without_a_copy() -> None:
    cache = TailCache(1 << 20)
    batch = chunk(1000, [100, 200, 300])
    cache.add(batch)
    assert len(cache) == 1
    assert cache.held_bytes == len(batch.data) + RUN_OVERHEAD_BYTES
    for offset, size in ((1000, 600), (1100, 200), (1300, 300), (1001, 1)):
        assert got(cache, offset, size) == LOG[offset : offset + size]
    view = cache.get(1100, 200)
    assert isinstance(view, memoryview) and view.obj is batch.data  # a view, no copy


def test_a_range_across_adjacent_batches() -> None:
    cache = TailCache(1 << 20)
    cache.add(chunk(1000, [100, 500]))
    cache.add(chunk(1600, [50, 350]))
    cache.add(chunk(2000, [10]))
    assert got(cache, 1500, 300) == LOG[1500:1800]
    assert got(cache, 1000, 1010) == LOG[1000:2010]
    assert joined(cache, [(1000, 100), (1600, 400)]) == LOG[1000:1100] + LOG[1600:2000]


def test_misses_before_after_and_over_a_gap() -> None:
    cache = TailCache(1 << 20)
    cache.add(chunk(1000, [300, 300]))
    cache.add(chunk(1700, [300]))  # 1600..1700 is not held
    assert got(cache, 900, 100) is None
    assert got(cache, 990, 20) is None
    assert got(cache, 1550, 100) is None  # runs into the gap
    assert got(cache, 1600, 50) is None
    assert got(cache, 1650, 100) is None
    assert got(cache, 1990, 20) is None  # past the end
    assert got(cache, 2000, 1) is None
    assert got(cache, 1000, 0) is None
    assert got(cache, 1700, 300) == LOG[1700:2000]


def test_eviction_keeps_the_newest_within_max_bytes() -> None:
    cost = len(HEAD) + 100 + RUN_OVERHEAD_BYTES
    cache = TailCache(3 * cost)
    for index in range(6):
        cache.add(chunk(1000 + 100 * index, [100]))
        assert cache.held_bytes <= 3 * cost
    assert len(cache) == 3 and cache.held_bytes == 3 * cost
    assert got(cache, 1200, 300) is None and got(cache, 1299, 1) is None
    assert got(cache, 1300, 300) == LOG[1300:1600]
    # A batch larger than the whole cache is not kept (nor anything older).
    cache.add(chunk(1600, [4 * cost]))
    assert len(cache) == 0 and cache.held_bytes == 0
    assert got(cache, 1500, 100) is None


def test_eviction_over_many_runs_stays_consistent() -> None:
    cost = len(HEAD) + 10 + RUN_OVERHEAD_BYTES
    cache = TailCache(50 * cost)
    for index in range(5 * _COMPACT_MIN):
        newest = 1000 + 10 * index
        cache.add(chunk(newest, [10]))
        oldest = max(1000, newest - 490)
        assert got(cache, oldest, newest + 10 - oldest) == LOG[oldest : newest + 10]
        assert got(cache, newest - 500, 10) is None
    assert len(cache) == 50
    cache.discard_below(newest - 90)
    assert len(cache) == 10
    assert got(cache, newest - 90, 100) == LOG[newest - 90 : newest + 10]


def test_an_evicted_run_lets_go_of_its_bytes_at_once() -> None:
    # Held until the next compaction, evicted chunks doubled the cache's memory and were
    # freed in bursts (docs/performance.md, "The dispatch's CPU per message, third round").
    cost = len(HEAD) + 100 + RUN_OVERHEAD_BYTES
    cache = TailCache(2 * cost)
    oldest = chunk(1000, [100])
    data = oldest.data
    unheld = sys.getrefcount(data)
    cache.add(oldest)
    del oldest
    assert sys.getrefcount(data) == unheld  # the batch's reference went, the run's came
    cache.add(chunk(1100, [100]))
    assert sys.getrefcount(data) == unheld
    cache.add(chunk(1200, [100]))  # evicts the first run, long before a compaction
    assert sys.getrefcount(data) == unheld - 1
    assert len(cache) == 2 and got(cache, 1100, 200) == LOG[1100:1300]
    cache.discard_below(1200)
    assert len(cache) == 1 and got(cache, 1200, 100) == LOG[1200:1300]


def test_clear_and_discard_below() -> None:
    cache = TailCache(1 << 20)
    cache.add(chunk(1000, [100]))
    cache.add(chunk(1100, [100]))
    cache.discard_below(1050)  # drops the run starting below it, whole
    assert got(cache, 1050, 10) is None and got(cache, 1100, 100) == LOG[1100:1200]
    cache.clear()
    assert len(cache) == 0 and cache.held_bytes == 0 and cache.end_offset == 0
    assert got(cache, 1100, 100) is None
    cache.add(chunk(500, [10]))  # anything may come after a clear
    assert got(cache, 500, 10) == LOG[500:510]


def test_zero_max_bytes_turns_it_off() -> None:
    cache = TailCache(0)
    cache.add(chunk(1000, [100]))
    assert len(cache) == 0 and cache.held_bytes == 0
    assert got(cache, 1000, 100) is None
    assert joined(cache, [(1000, 100)]) is None
    with pytest.raises(ValueError, match="max_bytes"):
        TailCache(-1)


def test_a_batch_starting_below_the_end_clears_first() -> None:
    cache = TailCache(1 << 20)
    cache.add(chunk(1000, [100, 100]))
    cache.add(chunk(1200, [100]))
    cache.add(chunk(1100, [50]))  # a follower restarted further back
    assert len(cache) == 1
    assert got(cache, 1000, 100) is None and got(cache, 1200, 100) is None
    assert got(cache, 1100, 50) == LOG[1100:1150]


def test_records_not_back_to_back_are_split_into_runs() -> None:
    # Offsets 1000+100, a gap (a blank marker's filler, 40 bytes in the buffer too),
    # 1140+60; then a record from another buffer (positions jump, offsets go on).
    data = HEAD + LOG[1000:1200] + b"X" * 9 + LOG[1200:1250]
    positions = [3, 103, 143, 212]
    batch = make_batch(data, positions, [1000, 1100, 1140, 1200], [100, 40, 60, 50])
    gap = make_batch(data, [3, 143], [1000, 1140], [100, 60])
    cache = TailCache(1 << 20)
    cache.add(batch)
    assert len(cache) == 2  # 1000..1200, 1200..1250: adjacent, not one run in data
    assert got(cache, 1000, 250) == LOG[1000:1250]
    cache.clear()
    cache.add(gap)
    assert len(cache) == 2
    assert got(cache, 1000, 100) == LOG[1000:1100]
    assert got(cache, 1140, 60) == LOG[1140:1200]
    assert got(cache, 1000, 200) is None  # the gap is not records


def test_records_outside_their_buffer_are_not_kept() -> None:
    cache = TailCache(1 << 20)
    cache.add(make_batch(b"", [0, 0], [1000, 1100], [100, 100]))
    assert len(cache) == 0 and got(cache, 1000, 100) is None


def test_a_small_part_of_a_large_buffer_is_copied() -> None:
    data = HEAD + LOG[1000:1100] + bytes(10_000)  # e.g. the start of a record to come
    cache = TailCache(1 << 20)
    cache.add(make_batch(data, [3], [1000], [100]))
    assert cache.held_bytes == 100 + RUN_OVERHEAD_BYTES
    view = cache.get(1000, 100)
    assert view is not None and bytes(view) == LOG[1000:1100]
    assert not (isinstance(view, memoryview) and view.obj is data)


def test_records_counts_hits_and_misses() -> None:
    cache = TailCache(1 << 20)
    cache.add(chunk(1000, [100, 100, 100]))
    assert joined(cache, [(1000, 100), (1200, 100)]) == LOG[1000:1100] + LOG[1200:1300]
    assert joined(cache, [(1000, 100), (1300, 1)]) is None  # all or nothing
    assert joined(cache, []) is None  # nothing asked: not counted
    assert (cache.hits, cache.misses) == (1, 1)
    # The arrival notices' entries (counted=False): the counters are the pulls' reads.
    assert joined(cache, [(1000, 100)], counted=False) == LOG[1000:1100]
    assert joined(cache, [(1300, 1)], counted=False) is None
    assert (cache.hits, cache.misses) == (1, 1)


def test_records_are_views_of_the_held_buffers_that_outlive_eviction() -> None:
    """Views into the buffers the runs reference (no copy), unchanged after the runs
    they came from are evicted."""
    cache = TailCache(1 << 20)
    batch = chunk(1000, [100, 100, 100])
    cache.add(batch)
    parts = cache.records([(1000, 100), (1200, 50)])
    assert parts is not None and all(isinstance(part, memoryview) for part in parts)
    assert all(part.obj is batch.data for part in parts)
    assert b"".join(parts) == LOG[1000:1100] + LOG[1200:1250]
    cache.clear()
    assert b"".join(parts) == LOG[1000:1100] + LOG[1200:1250]


# -- batches from the Tail assembler -------------------------------------------------
def test_batches_from_the_assembler_serve_the_commitlog_bytes() -> None:
    """A chunk across a segment end (records, blank marker, next segment) and a record
    split across two chunks: every record's bytes as in the commitlog."""
    segment0, offsets0, segment1, offsets1 = segment_with_blank()
    more, offsets2 = records_from(SEGMENT + len(segment1), [b"5" * 300, b"6" * 10])
    stream = segment0 + segment1 + more  # the commitlog from offset 0
    split = SEGMENT + len(segment1) + 150  # inside the record of body 5
    assembler = RecordAssembler(0)
    cache = TailCache(1 << 20)
    raw = b"\x0a\x05" + stream[:split]  # the records after a few header bytes
    for batch in assembler.feed_chunk(0, raw, 2, len(raw)):
        cache.add(batch)
    for batch in assembler.feed_chunk(split, stream[split:]):
        cache.add(batch)
    first, last0 = offsets0[0], offsets0[-1] + len(record(0, b"2" * 200))
    assert len(cache) == 4  # segment 0's records, segment 1's, the split one, the rest
    assert got(cache, first, last0) == stream[first:last0]
    assert got(cache, first, last0 + 1) is None  # the blank marker is not a record
    assert got(cache, offsets1[0], len(stream) - offsets1[0]) == stream[offsets1[0] :]
    assert offsets2[0] < split < offsets2[1]
    assert got(cache, offsets2[0], len(stream) - offsets2[0]) == stream[offsets2[0] :]


def test_metrics_report_the_tail_cache() -> None:
    cache = TailCache(1 << 20)
    cache.add(chunk(1000, [100]))
    status = SimpleNamespace(
        dispatched_offset=1100,
        durable_offset=1100,
        queues=1,
        cq_segments=1,
        index_files=1,
        index_entries=1,
        disk_full="",
    )
    dispatcher = SimpleNamespace(
        storage_max_seen=1100, tail_reconnects=0, follower_state="connected"
    )
    running = SimpleNamespace(
        store=SimpleNamespace(status=lambda: status),
        dispatcher=dispatcher,
        schedule=None,
        timer=None,
        transactions=None,
        pop=None,
    )
    metrics = DispatchMetrics(lambda: cast(Running, running), ArrivalHub(), tail_cache=cache)
    sample = cast(dict[str, Any], metrics.sample())
    assert sample["tide_dispatch_tail_cache_bytes"] == cache.held_bytes > 100
    without = DispatchMetrics(lambda: cast(Running, running), ArrivalHub())
    assert "tide_dispatch_tail_cache_bytes" not in cast(dict[str, Any], without.sample())


# -- against real storage and dispatch processes -------------------------------------
def spans_request(
    topic: str, queue_id: int = 0, *, records: bool = True, **fields: Any
) -> pb.GetQueueEntriesRequest:
    fields.setdefault("max_count", 1024)
    return pb.GetQueueEntriesRequest(
        topic=topic, queue_id=queue_id, spans=True, records=records, **fields
    )


def storage_records(pair: Pair, response: pb.GetQueueEntriesResponse) -> bytes:
    """What Storage/Read answers for the response's spans (each must be FOUND)."""
    read = pair.storage.stub.Read(
        storage_pb.ReadRequest(spans=response.spans), timeout=RPC_TIMEOUT_S
    )
    assert list(read.span_statuses) == [storage_pb.FOUND] * len(response.spans)
    return read.records


def cached(pair: Pair, request: pb.GetQueueEntriesRequest) -> pb.GetQueueEntriesResponse:
    """The answer to ``request`` once it carries records (a batch is cached right after it
    is applied: a call just before may see its entries without them)."""
    answer: list[pb.GetQueueEntriesResponse] = []

    def has_records() -> bool:
        answer[:] = [get(pair, request)]
        return bool(answer[0].records)

    wait_until(has_records, "the tail cache to answer records", timeout_s=5.0)
    return answer[0]


def test_records_are_what_storage_read_answers(shared_pair: Pair, topic_name: str) -> None:
    queues = [0, 0, 1, 0, 1, 1, 0, 0, 0, 1]
    batches = [
        [
            message(topic_name, q, bytes([65 + i]) * (37 * i + j), tags="AB"[i % 2])
            for i, q in enumerate(queues)
        ]
        for j in range(3)
    ]
    results = append_dispatched(shared_pair, batches)
    requests = [
        spans_request(topic_name, 0),
        spans_request(topic_name, 1),
        spans_request(topic_name, 0, offset=3, max_count=5),
        spans_request(topic_name, 0, max_bytes=results[0].size + results[1].size),
        spans_request(topic_name, 1, tag_codes=[tags_code("A")]),
    ]
    for req in requests:
        response = cached(shared_pair, req)
        assert response.spans and not response.entries
        assert response.records == storage_records(shared_pair, response)
        assert len(response.records) == sum(s.size for s in response.spans)
        # Without `records` (or without `spans`): the same answer, no records.
        plain = get(shared_pair, spans_request(topic_name, req.queue_id, records=False))
        assert plain.spans and not plain.records
    as_entries = pb.GetQueueEntriesRequest(topic=topic_name, max_count=1024, records=True)
    answer = get(shared_pair, as_entries)
    assert answer.entries and not answer.spans and not answer.records
    # Nothing selected: no records, not an error.
    none = get(shared_pair, spans_request(topic_name, 0, tag_codes=[tags_code("nope")]))
    assert not none.spans and not none.records
    at_end = get(shared_pair, spans_request(topic_name, 0, offset=none.max_offset))
    assert not at_end.spans and not at_end.records


def test_records_over_the_stream(shared_pair: Pair, topic_name: str) -> None:
    results = append_dispatched(
        shared_pair, [[message(topic_name, i % 2, b"s" * (50 * i + 1)) for i in range(10)]]
    )
    requests = [
        spans_request(topic_name, 0),
        spans_request(topic_name, 1, offset=1, max_count=2),
        spans_request(topic_name, 0, records=False),
        spans_request(topic_name, 0, max_bytes=results[0].size),
    ]
    cached(shared_pair, requests[0])
    answers = asyncio.run(exchange(shared_pair.dispatch.listen, requests))
    for req, answer in zip(requests, answers, strict=True):
        assert not answer.error_code, answer.error_message
        response = answer.response
        assert response == get(shared_pair, req)
        if req.records:
            assert response.records == storage_records(shared_pair, response)
        else:
            assert not response.records
    assert answers[3].response.records == storage_records(shared_pair, answers[3].response)
    assert len(answers[3].response.records) == results[0].size


def test_zero_tail_cache_bytes_never_answers_records(
    tmp_path: Path, launchers: tuple[StorageLauncher, DispatchLauncher]
) -> None:
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen, "--tail-cache-bytes", "0")
    pair = Pair(storage, dispatch)
    append_dispatched(pair, [[message("Off", 0, b"x" * i) for i in range(10)]])
    # Deliberately lets time pass: records never come, so there is no state to wait on.
    time.sleep(0.2)
    response = get(pair, spans_request("Off"))
    assert [s.count for s in response.spans] == [10] and not response.records
    dispatch.stop()
    storage.stop()


def test_after_a_restart_only_what_was_followed_since_is_served(
    tmp_path: Path, launchers: tuple[StorageLauncher, DispatchLauncher]
) -> None:
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen)
    pair = Pair(storage, dispatch)
    before = append_dispatched(pair, [[message("Again", 0, b"a" * i) for i in range(10)]])
    assert cached(pair, spans_request("Again")).records
    dispatch.stop()  # its progress file is flushed: a restart follows on from there

    storage.append([message("Again", 0, b"b" * i) for i in range(5)])
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen)
    pair = Pair(storage, dispatch)
    dispatch.wait_dispatched(storage.status().max_offset)
    # Followed since the restart: served.
    after = cached(pair, spans_request("Again", offset=len(before)))
    assert [s.count for s in after.spans] == [5]
    assert after.records == storage_records(pair, after)
    # Only before it: not held. Both: all or nothing, so none either.
    old = get(pair, spans_request("Again", max_count=len(before)))
    assert [s.count for s in old.spans] == [10] and not old.records
    both = get(pair, spans_request("Again"))
    assert sum(s.count for s in both.spans) == 15 and not both.records
    dispatch.stop()
    storage.stop()


@pytest.mark.parametrize("value", ["-1", str((4 << 30) + 1)])
def test_tail_cache_bytes_out_of_range_exits_2(
    value: str, launchers: tuple[StorageLauncher, DispatchLauncher]
) -> None:
    _, dispatches = launchers
    process = dispatches.spawn(Path("/nonexistent"), "127.0.0.1:1", "--tail-cache-bytes", value)
    assert process.wait_exit() == 2, process.describe()
    assert "--tail-cache-bytes" in process.describe()

"""lookup.search_offset over a real consume queue with a fake storage Read: the k-ary
search against a linear scan, with PRE_BLANK runs and equal timestamps."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from services.dispatch import lookup
from services.dispatch.engine.consume_queue import ConsumeQueue, Entry
from tide.v1 import storage_pb2 as pb


class FakeStorage:
    def __init__(self) -> None:
        self.timestamps: dict[int, int] = {}  # commitlog offset -> store time
        self.below_min = -1  # offsets at or below this are "deleted"
        self.calls = 0

    async def read(self, positions: Sequence[tuple[int, int]]) -> list[pb.ReadResult]:
        self.calls += 1
        assert len(positions) <= lookup.SEARCH_PROBES
        results = []
        for offset, _ in positions:
            if offset <= self.below_min:
                results.append(pb.ReadResult(status=pb.OFFSET_BELOW_MIN))
                continue
            message = pb.StoredMessage(store_timestamp_ms=self.timestamps[offset])
            results.append(pb.ReadResult(status=pb.FOUND, message=message))
        return results


def build(tmp_path: Path, rng: random.Random, count: int) -> tuple[ConsumeQueue, FakeStorage]:
    queue = ConsumeQueue(tmp_path, "T", 0, entries_per_segment=64)
    queue.load()
    queue.recover()
    storage = FakeStorage()
    queue_offset = rng.choice([0, 0, 3, 70])  # a first entry past 0 pads with PRE_BLANKs
    commitlog = 0
    ts = 1_000
    for _ in range(count):
        queue.put(queue_offset, commitlog, 100, 0)
        storage.timestamps[commitlog] = ts
        ts += rng.choice([0, 0, 1, 5])
        commitlog += 100
        queue_offset += 1
    return queue, storage


def expected(queue: ConsumeQueue, storage: FakeStorage, timestamp_ms: int) -> int:
    for entry in queue.get(queue.min_offset, 65_536):
        if entry.is_pre_blank:
            continue
        deleted = entry.commitlog_offset <= storage.below_min
        if not deleted and storage.timestamps[entry.commitlog_offset] >= timestamp_ms:
            return entry.queue_offset
    return queue.max_offset


async def on_a_thread(read: Callable[[], lookup.Probes]) -> lookup.Probes:
    """The rounds' consume-queue reads off the loop, as the servicer runs them."""
    return await asyncio.to_thread(read)


@pytest.mark.parametrize("seed", range(12))
def test_search_matches_a_linear_scan(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    queue, storage = build(tmp_path, rng, rng.choice([1, 2, 15, 16, 17, 300, 2000]))
    if seed % 3 == 0:
        storage.below_min = rng.randrange(0, 100 * len(storage.timestamps))
    times = sorted(storage.timestamps.values())
    probes = {0, times[0], times[-1], times[-1] + 1, *rng.sample(range(900, times[-1] + 10), 20)}

    async def check() -> None:
        for t in sorted(probes):
            storage.calls = 0
            got = await lookup.search_offset(queue, t, storage.read, on_a_thread)
            assert got == expected(queue, storage, t), (t, seed)
            assert storage.calls <= 4  # 16 probes a round: 2000 entries need 3 rounds

    try:
        asyncio.run(check())
    finally:
        queue.close()


def test_empty_queue_answers_its_max_offset(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path, "T", 0, entries_per_segment=64)
    queue.load()
    queue.recover()
    storage = FakeStorage()
    try:
        assert asyncio.run(lookup.search_offset(queue, 5, storage.read, on_a_thread)) == 0
        assert storage.calls == 0
    finally:
        queue.close()


def test_query_verification_batches_are_bounded_by_count_and_bytes() -> None:
    """QueryIndex reads its candidates' whole messages back: a batch holds at most
    VERIFY_BATCH of them and VERIFY_BATCH_BYTES of records (at least one)."""

    def located(sizes: list[int]) -> list[lookup.Located]:
        return [lookup.Located(Entry(i, i * 1000, size, 0), 0) for i, size in enumerate(sizes)]

    small = located([100] * 600)
    assert [len(b) for b in lookup.verify_batches(small)] == [256, 256, 88]
    big = lookup.VERIFY_BATCH_BYTES // 3 + 1  # three would pass the byte bound
    batches = list(lookup.verify_batches(located([big] * 7)))
    assert [len(b) for b in batches] == [2, 2, 2, 1]
    assert all(sum(item.entry.size for item in b) <= lookup.VERIFY_BATCH_BYTES for b in batches)
    huge = located([lookup.VERIFY_BATCH_BYTES * 2, 10])  # alone past the bound: still read
    assert [len(b) for b in lookup.verify_batches(huge)] == [1, 1]
    assert list(lookup.verify_batches([])) == []

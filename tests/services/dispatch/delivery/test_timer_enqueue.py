"""The timer's enqueue reads the timer topic's records from the dispatch's tail cache when
it holds them, and only the rest from the storage: both ways file the same units (slot,
size, real topic's hash, delete flag) as the storage's answer would."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from services.dispatch.delivery.timer_enqueue import Enqueuer
from services.dispatch.delivery.timer_store import TimerSettings, TimerStore
from services.dispatch.engine.consume_queue import ConsumeQueue, Entry
from services.dispatch.storage_client import StorageClient
from services.dispatch.tail_cache import TailCache
from tests.services.dispatch.test_tail_cache import make_batch
from tide.format import (
    TIMER_DEL_UNIQKEY,
    TIMER_LOG_UNIT_BYTES,
    TIMER_TOPIC,
    TimerWheelGeometry,
    encode_properties,
    encode_record,
    patch_record,
    timer_properties,
)
from tide.v1 import storage_pb2 as spb

GEOMETRY = TimerWheelGeometry(precision_ms=1000, slots_total=3600)
T0 = 1_700_000_000_000
HOST = b"\x7f\x00\x00\x01\x00\x00\x27\x10"


def timer_record(offset: int, properties: dict[str, str]) -> bytes:
    topic = TIMER_TOPIC
    encoded = encode_record(
        topic, topic.encode(), 0, b"body", encode_properties(properties), 0, 0, T0, HOST, HOST
    )
    data = bytearray(encoded.data)
    patch_record(data, 0, encoded.store_timestamp_pos, 0, offset, T0)
    return bytes(data)


class Queue:
    """The timer topic's consume queue over ``entries``."""

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.min_offset = 0
        self.max_offset = len(entries)

    def get(self, offset: int, count: int) -> list[Entry]:
        return self.entries[offset : offset + count]


class Storage:
    """Answers Read from ``records`` (by offset) and remembers what it was asked."""

    def __init__(self, records: dict[int, tuple[bytes, dict[str, str]]]) -> None:
        self.records = records
        self.asked: list[int] = []

    async def read(self, positions: Sequence[tuple[int, int]]) -> list[spb.ReadResult]:
        results = []
        for offset, _ in positions:
            self.asked.append(offset)
            _, properties = self.records[offset]
            message = spb.StoredMessage(topic=TIMER_TOPIC, properties=properties)
            results.append(spb.ReadResult(status=spb.FOUND, message=message))
        return results


def test_enqueue_reads_the_tail_cache_first_and_the_storage_for_the_rest(
    tmp_path: Path,
) -> None:
    specs = [
        timer_properties({"UNIQ_KEY": f"U{i}"}, f"Real{i % 2}", 0, T0 + 5000 + i * 1000, 0, 1000)
        for i in range(6)
    ]
    specs[4] = {**specs[4], TIMER_DEL_UNIQKEY: "recall"}  # a recall is a DELETE unit
    records: dict[int, tuple[bytes, dict[str, str]]] = {}
    entries: list[Entry] = []
    offset = 0
    for index, properties in enumerate(specs):
        data = timer_record(offset, properties)
        records[offset] = (data, properties)
        entries.append(Entry(index, offset, len(data), 0))
        offset += len(data)
    cached = entries[2:]  # the cache holds the newest four, the storage all six
    start = cached[0].commitlog_offset
    cache = TailCache(1 << 20)
    cache.add(
        make_batch(
            b"".join(records[e.commitlog_offset][0] for e in cached),
            [e.commitlog_offset - start for e in cached],
            [e.commitlog_offset for e in cached],
            [e.size for e in cached],
        )
    )

    def filed_units(tail_cache: TailCache | None, directory: Path) -> tuple[list[object], int]:
        store = TimerStore(directory, TimerSettings(GEOMETRY, 600, 1 << 20))
        store.open(T0)
        storage = Storage(records)
        enqueuer = Enqueuer(
            store,
            cast(StorageClient, storage),
            lambda topic, queue_id: cast(ConsumeQueue, Queue(entries)),
            tail_cache,
        )
        moved = asyncio.run(enqueuer.step())
        assert moved == len(entries) and store.queue_offset == len(entries)
        assert enqueuer.skipped == 0 and enqueuer.filed == len(entries)
        log = store.timer_log
        units: list[object] = [
            log.read(p) for p in range(log.min_offset, log.end, TIMER_LOG_UNIT_BYTES)
        ]
        store.close()
        return units, len(storage.asked)

    from_cache, asked = filed_units(cache, tmp_path / "cached")
    assert asked == 2  # only the two records the cache does not hold
    from_storage, asked_all = filed_units(None, tmp_path / "storage")
    assert asked_all == len(entries)
    assert from_cache == from_storage and len(from_cache) == len(entries)

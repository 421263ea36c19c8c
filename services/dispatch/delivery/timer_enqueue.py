"""Enqueue: file the timer topic's messages into the timer log and wheel
(``TimerMessageStore``'s enqueue get/put services in one step).

Reads ``rmq_sys_wheel_timer`` queue 0 from ``TimerStore.queue_offset``, a bounded batch at
a time, reads each message's timer properties (from the dispatch's tail cache when it still
holds the record, which it does for an enqueue that keeps up: a storage Read per batch was
most of the enqueue's CPU; else from the storage) and files a unit: a timed
message under its ``TIMER_OUT_MS`` slot, a recall (``TIMER_DEL_UNIQKEY``) as a DELETE unit
in the same slot. The queue offset only reaches the checkpoint with the log position of
its units (timer_store.Snapshot): at-least-once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from services.dispatch.delivery.timer_store import TimerStore
from services.dispatch.engine.consume_queue import ConsumeQueue, Entry
from services.dispatch.read_through import Position, read_through
from services.dispatch.storage_client import StorageClient
from services.dispatch.tail_cache import TailCache
from tide.format import (
    REAL_TOPIC,
    TIMER_DEL_UNIQKEY,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
    TIMER_TOPIC,
    RecordError,
    java_string_hashcode,
    record_topic_and_properties,
    timer_slot_time_ms,
)
from tide.limits import READ_MAX_POSITIONS
from tide.v1 import storage_pb2 as spb

log = logging.getLogger("tide.dispatch.timer")
# Timer-topic messages read and filed in one step (one storage Read).
ENQUEUE_BATCH_MESSAGES = min(256, READ_MAX_POSITIONS)
TIMER_QUEUE_ID = 0
# A timer-topic message's topic and properties, all the enqueue needs of it.
_Fields = tuple[str, Mapping[str, str]]


def slot_time_of(props: Mapping[str, str], store: TimerStore) -> int | None:
    """The slot time a timer-topic message is filed under: TIMER_OUT_MS as the gateway
    set it, else from TIMER_DELIVER_MS (None: neither, not a timed message)."""
    out = props.get(TIMER_OUT_MS, "")
    if out.lstrip("-").isdigit():
        return int(out)
    deliver = props.get(TIMER_DELIVER_MS, "")
    if deliver.isdigit():
        return timer_slot_time_ms(store.geometry, int(deliver))
    return None


class Enqueuer:
    def __init__(
        self,
        store: TimerStore,
        storage: StorageClient,
        find_queue: Callable[[str, int], ConsumeQueue | None],
        tail_cache: TailCache | None = None,
    ) -> None:
        self._store = store
        self._storage = storage
        self._find_queue = find_queue
        self._tail_cache = tail_cache
        self.filed = 0  # units filed since start (messages and recalls)
        self.skipped = 0  # timer-topic messages that were not timed (logged)

    async def step(self) -> int:
        """File the next batch; how many queue entries it moved past (0: nothing new).
        Raises grpc.aio.AioRpcError when the storage does not answer."""
        queue = self._find_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
        if queue is None:
            return 0
        store = self._store
        offset = store.queue_offset
        max_offset, min_offset = queue.max_offset, queue.min_offset
        if offset < min_offset:
            log.warning(
                "timer topic: queue offsets %d..%d were deleted before they were filed; "
                "continuing at %d",
                offset,
                min_offset - 1,
                min_offset,
            )
            store.queue_offset = offset = min_offset
        if offset > max_offset:
            # The commitlog lost its tail (the storage's recovery cut it): file again what
            # the queue holds now from there.
            log.warning(
                "timer topic queue ends at %d, below %d filed; following it", max_offset, offset
            )
            store.queue_offset = offset = max_offset
        if offset >= max_offset:
            return 0
        got = queue.get(offset, min(ENQUEUE_BATCH_MESSAGES, max_offset - offset))
        if not got:
            return 0  # a truncation of the queue is running: look again
        entries = [e for e in got if not e.is_pre_blank]  # padding names no message
        fields = await self._read(entries)
        if store.queue_offset != offset:
            return 0  # recovered or moved meanwhile: read again from where it is
        for entry, found in zip(entries, fields, strict=True):
            self._file(entry.commitlog_offset, entry.size, found)
        store.queue_offset = got[-1].queue_offset + 1
        return len(got)

    async def _read(self, entries: list[Entry]) -> list[_Fields | str]:
        """Each entry's (topic, properties): from the tail cache when it holds the record,
        else from the storage (one Read for the rest); a string says why there is none."""
        positions = [(entry.commitlog_offset, entry.size) for entry in entries]
        return await read_through(positions, self._tail_cache, _held_fields, self._read_stored)

    async def _read_stored(self, positions: list[Position]) -> list[_Fields | str]:
        return [_fields_of(result) for result in await self._storage.read(positions)]

    def _file(self, commitlog_offset: int, size: int, found: _Fields | str) -> None:
        if isinstance(found, str):
            log.warning("timer topic message at %d: %s; not filed", commitlog_offset, found)
            self.skipped += 1
            return
        topic, properties = found
        store = self._store
        slot_time = slot_time_of(properties, store)
        if topic != TIMER_TOPIC or slot_time is None:
            log.warning(
                "message at %d of %s has no timer properties; not filed",
                commitlog_offset,
                topic,
            )
            self.skipped += 1
            return
        topic_hash = java_string_hashcode(properties.get(REAL_TOPIC, ""))
        delete = TIMER_DEL_UNIQKEY in properties
        if delete and slot_time < store.earliest_slot_ms():
            # A recall that came after its slot fired (or while it fires): nothing left to
            # cancel, and filed elsewhere it would cancel nothing either.
            return
        store.file(commitlog_offset, size, slot_time, topic_hash, delete=delete)
        self.filed += 1


def _held_fields(data: bytes | memoryview, position: Position) -> _Fields | str:
    try:
        return record_topic_and_properties(data, 0, position[1])
    except RecordError as exc:
        return f"its record does not decode: {exc}"


def _fields_of(result: spb.ReadResult) -> _Fields | str:
    if result.status != spb.FOUND:
        return f"gone from the storage ({spb.ReadStatus.Name(result.status)})"
    return result.message.topic, result.message.properties

"""Dequeue: fire the wheel's slots whose period is over (``TimerMessageStore``'s dequeue
services in one step).

A slot is fired in two walks of its chain in the timer log, ``CHAIN_BATCH_UNITS`` units
at a time: the first reads the recalls (DELETE units) filed in it, the second reads the
messages, files the ROLL ones again (their time is beyond the window they were filed
in), leaves out the recalled ones and re-puts the rest to their real topic and queue.
Only then does ``read_time_ms`` move past the slot: a crash meanwhile fires it again
(at-least-once). The recalls held are those of one slot (RocketMQ holds them likewise).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from services.dispatch.delivery.reput import DueMessage, Reput
from services.dispatch.delivery.timer_enqueue import slot_time_of
from services.dispatch.delivery.timer_store import TimerStore, is_delete, is_roll
from services.dispatch.storage_client import StorageClient
from tide.format import (
    REAL_TOPIC,
    TIMER_DEL_UNIQKEY,
    TIMER_DELIVER_MS,
    TIMER_TOPIC,
    UNIQ_KEY,
    DecodedRecord,
    RecordError,
    TimerLogUnit,
    decode_record,
    timer_delete_key,
)
from tide.mapped import read_through_file

log = logging.getLogger("tide.dispatch.timer")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Dequeuer:
    def __init__(
        self,
        store: TimerStore,
        storage: StorageClient,
        reput: Reput,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self._store = store
        self._storage = storage
        self._reput = reput
        self._clock_ms = clock_ms
        # A slot's chain is walked here, batch by batch (chain_batches): its units may be
        # hours old and on the disk only, and this thread reads them with pread instead of
        # faulting on the event loop with the GIL held. One walk at a time (fire's).
        self._reader = ThreadPoolExecutor(
            1, thread_name_prefix="tide-timer-read", initializer=read_through_file
        )
        self.delivered = 0
        self.recalled = 0
        self.rolled = 0

    def due(self) -> bool:
        """The next slot's period is over."""
        store = self._store
        return store.read_time_ms + store.geometry.precision_ms <= self._clock_ms()

    def wait_ms(self) -> int:
        """How long until the next slot's period is over."""
        store = self._store
        return max(0, store.read_time_ms + store.geometry.precision_ms - self._clock_ms())

    async def fire(self) -> None:
        """Fire the slot at ``read_time_ms`` and move past it. Raises AioRpcError when the
        storage does not answer a Read (the slot is then fired again)."""
        store = self._store
        slot_time = store.read_time_ms
        store.firing = True
        try:
            if store.slot_units(slot_time) > 0:
                deleted = await self._recalls(slot_time)
                async for units in self.chain_batches(slot_time):
                    await self._deliver(units, deleted)
            store.read_time_ms = slot_time + store.geometry.precision_ms
        finally:
            store.firing = False

    async def _recalls(self, slot_time: int) -> set[str]:
        deleted: set[str] = set()
        async for units in self.chain_batches(slot_time):
            marks = [u for u in units if is_delete(u) and not is_roll(u)]
            for record in await self._read(marks):
                if record is not None:
                    deleted.add(record.properties.get(TIMER_DEL_UNIQKEY, ""))
        return deleted

    async def chain_batches(self, slot_time: int) -> AsyncIterator[list[TimerLogUnit]]:
        """The slot's chain (TimerStore.chain), each batch read on the reader thread."""
        chain = self._store.chain(slot_time)
        loop = asyncio.get_running_loop()
        while (units := await loop.run_in_executor(self._reader, next, chain, None)) is not None:
            yield units

    def close(self) -> None:
        """Stop the reader thread (after the walk it may be doing)."""
        self._reader.shutdown(wait=True)

    async def _read(self, units: Sequence[TimerLogUnit]) -> list[DecodedRecord | None]:
        if not units:
            return []
        positions = [(u.commitlog_offset, u.commitlog_size) for u in units]
        records: list[DecodedRecord | None] = []
        for unit, data in zip(units, await self._storage.read_records(positions), strict=True):
            where = f"{TIMER_TOPIC} at commitlog offset {unit.commitlog_offset}"
            if data is None:
                self._reput.undeliverable(where, "its record is gone from the storage (retention)")
                records.append(None)
                continue
            try:
                record = decode_record(data, 0, len(data), expected_offset=unit.commitlog_offset)
            except RecordError as exc:
                # Counted and skipped like the delay levels do: raising here would fire the
                # slot again and again, holding every later slot behind one bad record.
                self._reput.undeliverable(where, f"its record does not decode: {exc}")
                records.append(None)
                continue
            records.append(record)
        return records

    async def _deliver(self, units: Sequence[TimerLogUnit], deleted: set[str]) -> None:
        store = self._store
        wanted = [u for u in units if not (is_delete(u) and not is_roll(u))]
        due: list[DueMessage] = []
        for unit, record in zip(wanted, await self._read(wanted), strict=True):
            store.pending -= 0 if is_delete(unit) else 1
            if record is None:
                continue
            if is_roll(unit):
                self._refile(unit, record)
                continue
            props = record.properties
            key = timer_delete_key(props.get(REAL_TOPIC, ""), props.get(UNIQ_KEY, ""))
            if key in deleted:
                self.recalled += 1
                continue
            deliver = props.get(TIMER_DELIVER_MS, "")
            due_ms = int(deliver) if deliver.isdigit() else unit.delayed_time_ms
            due.append(DueMessage(record, due_ms))
        if due:
            # Returns once all is appended (or found undeliverable, logged and counted by
            # the re-put): only then may the wheel move past the slot.
            result = await self._reput.put(due)
            self.delivered += result.delivered

    def _refile(self, unit: TimerLogUnit, record: DecodedRecord) -> None:
        """A ROLL unit fired: file its message again, nearer its time."""
        slot_time = slot_time_of(record.properties, self._store)
        if slot_time is None:
            return
        self._store.file(
            unit.commitlog_offset,
            unit.commitlog_size,
            slot_time,
            unit.topic_hash,
            delete=is_delete(unit),
        )
        self.rolled += 1

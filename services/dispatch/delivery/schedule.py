"""Delay levels: RocketMQ's ScheduleMessageService, beside the consume queues it reads.

A message produced with delay level *n* is stored in ``SCHEDULE_TOPIC_XXXX`` queue
``n - 1``; the dispatch gives its consume queue entry the delivery time as tags code
(store time + the level's delay). Per level, one task reads the level's queue from its
progress (``delayOffset.json``): entries whose delivery time has come are read (from the
tail cache, else the storage), re-put to their real topic (reput.py), and the level's
offset moves past them. Within a level delivery times only grow (same delay, store times
in order), so the first entry not due yet is where the level waits, until that time.

Waiting costs one timer per level at most: a level sleeps until its head entry is due,
or, with nothing pending, until the dispatcher publishes an arrival for its queue
(ArrivalHub). No polling of the queues.

Only while the followed storage is a master (role.py): a level looks at the role before
each step, and beside a slave waits until the storage is a master again. Progress is
saved after every delivered batch, copied to the storage every ``progress_interval_s``
when it moved, and at stop (progress.py). A crash repeats what was delivered after the
last save (at most the batch in flight of each level): at-least-once, never a loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from services.dispatch.arrivals import ArrivalHub
from services.dispatch.cold_entries import page_in
from services.dispatch.delivery.metrics import KIND_DELAY_LEVEL
from services.dispatch.delivery.progress import (
    DelayProgressFile,
    ProgressCopy,
    load_delay_offsets,
)
from services.dispatch.delivery.reput import DueMessage, Reput
from services.dispatch.delivery.role import RoleWatcher
from services.dispatch.engine.consume_queue import Entry
from services.dispatch.engine.consume_queue_store import ConsumeQueueStore
from services.dispatch.read_through import Position, as_bytes, read_through
from services.dispatch.storage_client import StorageClient
from services.dispatch.tail_cache import TailCache
from tide.format import (
    SCHEDULE_TOPIC,
    DelayLevelTable,
    RecordError,
    correct_deliver_timestamp_ms,
    decode_record,
    delay_level_of_queue,
    schedule_queue_id,
)
from tide.server import ColdReads
from tide.tail import Backoff
from tide.tasks import cancel_and_wait

log = logging.getLogger("tide.dispatch.delivery")

DELIVER_BATCH_ENTRIES = 256
"""Most entries of one level delivered per step (then progress moves and the loop turns)."""


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """What GetStatus reports (DeliveryStatus)."""

    delay_levels_ms: tuple[int, ...]
    active: bool
    pending: tuple[int, ...]  # per level, level 1 first


class ScheduleService:
    def __init__(
        self,
        *,
        queues: ConsumeQueueStore,
        storage: StorageClient,
        hub: ArrivalHub,
        tail_cache: TailCache,
        table: DelayLevelTable,
        store_dir: Path,
        role: RoleWatcher,
        progress_interval_s: float,
        cold_reads: ColdReads | None = None,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        self._queues = queues
        # A level's head may be hours old (its delay): entries far behind the end are
        # brought into memory off the loop first (cold_entries.py).
        self._cold_reads = cold_reads
        self._storage = storage
        self._hub = hub
        self._tail_cache = tail_cache
        self.table = table
        self._role = role
        self._progress = DelayProgressFile(
            store_dir, ProgressCopy(storage, role, "delay level progress")
        )
        self._store_dir = store_dir
        self._progress_interval_s = progress_interval_s
        self._clock_ms = clock_ms
        self.reput = Reput(storage, KIND_DELAY_LEVEL)
        self._offsets: dict[int, int] = {}  # level -> next queue offset to deliver
        self._saved: dict[int, int] = {}  # what the file says
        self._wake = {level: asyncio.Event() for level in self._levels()}
        self._tasks: list[asyncio.Task[None]] = []
        self._read_backoff = Backoff(initial_s=0.1, max_s=5.0)

    def _levels(self) -> range:
        return range(1, self.table.max_level + 1)

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        recorded = await asyncio.to_thread(load_delay_offsets, self._store_dir)
        self._progress.resume_version(recorded.data_version)
        self._offsets = {level: recorded.offset(level) for level in self._levels()}
        self._saved = dict(self._offsets)
        spawn = asyncio.create_task
        self._tasks = [spawn(self._watch_arrivals())]
        self._tasks += [spawn(self._deliver_level(level)) for level in self._levels()]
        self._tasks.append(spawn(self._save_periodically()))
        log.info(
            "delay levels %s: delivering from offsets %s once the storage is a master",
            self.table.text(),
            {level: offset for level, offset in self._offsets.items() if offset},
        )

    async def stop(self) -> None:
        """Stop every task (a re-put in flight is abandoned: it is not counted, so it is
        delivered again after the restart), then save the progress."""
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        await self._save()

    def state(self) -> ScheduleState:
        pending = []
        for level in self._levels():
            queue = self._queues.find(SCHEDULE_TOPIC, schedule_queue_id(level))
            offset = self._offsets.get(level, 0)
            pending.append(0 if queue is None else max(0, queue.max_offset - offset))
        return ScheduleState(self.table.delays_ms, self._role.active, tuple(pending))

    async def _watch_arrivals(self) -> None:
        async for grown in self._hub.watch([SCHEDULE_TOPIC]):
            for _topic, queue_id in grown:
                event = self._wake.get(delay_level_of_queue(queue_id))
                if event is not None:
                    event.set()

    # -- delivery --------------------------------------------------------------------
    async def _deliver_level(self, level: int) -> None:
        wake = self._wake[level]
        while True:
            wake.clear()  # before looking: an arrival from now on wakes the wait below
            if not self._role.active:
                await self._role.wait_active()
                continue
            wait_s = await self._deliver_due(level)
            if wait_s is None:
                await wake.wait()
            elif wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), wait_s)

    async def _deliver_due(self, level: int) -> float | None:
        """Deliver what is due at the head of ``level``'s queue. Returns how long until
        the head is due (0: more is due now), None when nothing is pending."""
        queue = self._queues.find(SCHEDULE_TOPIC, schedule_queue_id(level))
        if queue is None:
            return None
        offset = self._offsets[level]
        max_offset = queue.max_offset
        if offset < queue.min_offset:
            log.warning(
                "delay level %d: entries %d..%d were deleted by retention before delivery",
                level,
                offset,
                queue.min_offset - 1,
            )
            offset = self._offsets[level] = queue.min_offset
        if offset >= max_offset:
            return None
        count = min(DELIVER_BATCH_ENTRIES, max_offset - offset)
        await page_in(self._cold_reads, queue, offset, count)
        entries = queue.get(offset, count)
        now = self._clock_ms()
        due: list[Entry] = []
        for entry in entries:
            deliver_ms = correct_deliver_timestamp_ms(self.table, level, now, entry.tags_code)
            if deliver_ms > now:
                if not due:
                    return (deliver_ms - now) / 1000
                break
            due.append(entry)
        if not due:  # nothing looked at (a truncation is running): look again soon
            return 0.1
        await self._deliver(level, [e for e in due if not e.is_pre_blank])
        self._offsets[level] = due[-1].queue_offset + 1
        # Recorded at once (the storage's copy follows at the save interval): a crash
        # repeats at most the batch in flight of each level.
        await self._save(copy=False)
        return 0

    async def _deliver(self, level: int, entries: list[Entry]) -> None:
        records = await self._read(entries)
        messages: list[DueMessage] = []
        for entry, data in zip(entries, records, strict=True):
            where = f"{SCHEDULE_TOPIC} queue {schedule_queue_id(level)} offset {entry.queue_offset}"
            if data is None:
                self.reput.undeliverable(where, "its record is gone from the commitlog")
                continue
            try:
                record = decode_record(data, 0, len(data), expected_offset=entry.commitlog_offset)
            except RecordError as exc:
                self.reput.undeliverable(where, f"its record does not decode: {exc}")
                continue
            messages.append(DueMessage(record, entry.tags_code))
        await self.reput.put(messages)

    async def _read(self, entries: list[Entry]) -> list[bytes | None]:
        """Each entry's record: from the tail cache when it holds it, else the storage
        (retried with backoff while the storage does not answer)."""
        positions = [(entry.commitlog_offset, entry.size) for entry in entries]
        return await read_through(positions, self._tail_cache, as_bytes, self._read_stored)

    async def _read_stored(self, positions: list[Position]) -> list[bytes | None]:
        attempt = 0
        while True:
            try:
                read = await self._storage.read_records(positions)
                break
            except (grpc.aio.AioRpcError, RuntimeError) as exc:
                attempt += 1
                if attempt == 1:
                    log.warning("delay levels: reading due records failed (%s); retrying", exc)
                await asyncio.sleep(self._read_backoff.delay_s(attempt))
        return read

    # -- progress --------------------------------------------------------------------
    async def _save_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._progress_interval_s)
            try:
                await self._save()
                await self._progress.copy_pending()
            except OSError:
                log.exception("delay levels: saving progress failed; retrying at the next save")

    async def _save(self, *, copy: bool = True) -> None:
        offsets = dict(self._offsets)
        if offsets == self._saved:
            return
        # The live offsets: the file takes them under its lock, so a save that waited for
        # another level's never writes an older snapshot over a newer one.
        await self._progress.save(self._offsets, self._clock_ms(), copy=copy)
        self._saved = offsets

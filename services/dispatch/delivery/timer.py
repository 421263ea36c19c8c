"""The timer service (RocketMQ 5's ``TimerMessageStore``, RIP-43) in the dispatch process.

Three loops on the event loop: enqueue (files the timer topic into the log and wheel),
dequeue (fires each slot once its period is over and re-puts what is due), checkpoint
(syncs the files, records ``config/timercheck`` and copies it to the storage). Enqueue
and dequeue run only while the followed storage is a master (role.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grpc

from services.dispatch.delivery.progress import ProgressCopy
from services.dispatch.delivery.reput import Reput
from services.dispatch.delivery.role import RoleWatcher
from services.dispatch.delivery.timer_dequeue import Dequeuer
from services.dispatch.delivery.timer_enqueue import Enqueuer
from services.dispatch.delivery.timer_store import TimerSettings, TimerStore
from services.dispatch.engine.consume_queue import ConsumeQueue
from services.dispatch.storage_client import StorageClient
from services.dispatch.tail_cache import TailCache
from tide.format import TIMER_LOG_UNIT_BYTES, TIMER_TOPIC, TimerCheckpoint
from tide.tail import Backoff
from tide.tasks import cancel_and_wait
from tide.v1 import dispatch_pb2 as dpb
from tide.v1 import storage_pb2 as spb

log = logging.getLogger("tide.dispatch.timer")
# How often the enqueue loop, with nothing to do, looks at the timer topic again.
IDLE_POLL_S = 0.05
# The dequeue loop's longest sleep before it looks at the clock again (it may be set).
DUE_POLL_MAX_S = 0.5
FAILURE_BACKOFF = Backoff(initial_s=0.1, max_s=5.0)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class TimerOptions:
    settings: TimerSettings
    max_delay_ms: int
    checkpoint_interval_ms: int


class TimerService:
    def __init__(
        self,
        store_dir: Path,
        options: TimerOptions,
        storage: StorageClient,
        role: RoleWatcher,
        reput: Reput,
        find_queue: Callable[[str, int], ConsumeQueue | None],
        tail_cache: TailCache | None = None,
    ) -> None:
        self.options = options
        self.store = TimerStore(store_dir, options.settings)
        self._storage = storage
        self._role = role
        self._progress = ProgressCopy(storage, role, "timer checkpoint")
        self._stopping = False
        self.enqueuer = Enqueuer(self.store, storage, find_queue, tail_cache)
        self.dequeuer = Dequeuer(self.store, storage, reput)
        self._tasks: list[asyncio.Task[None]] = []
        self._syncing: asyncio.Future[TimerCheckpoint] | None = None

    @property
    def active(self) -> bool:
        return self._role.active and not self._stopping

    async def start(self) -> None:
        recovered = await asyncio.to_thread(self.store.open, _now_ms())
        log.info(
            "timer open: %d pending, slots fired up to %d, timer topic filed up to %d, log "
            "end %d (%d bytes past the checkpoint cut, %d slots relinked)",
            recovered.pending,
            recovered.read_time_ms,
            recovered.queue_offset,
            recovered.log_end,
            recovered.cut_bytes,
            recovered.relinked_slots,
        )
        if recovered.corrupt:
            await self._revise_queue_offset()
        for name, loop in (
            ("enqueue", partial(self._steps, "enqueue", self._enqueue_step)),
            ("dequeue", partial(self._steps, "dequeue", self._dequeue_step)),
            ("checkpoint", self._checkpoint_loop),
        ):
            self._tasks.append(asyncio.create_task(self._guard(name, loop), name=f"timer-{name}"))

    async def stop(self) -> None:
        """Stop the loops (a slot being fired is fired again after a restart), record the
        progress, close the files."""
        self._stopping = True
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        if self._syncing is not None:  # a save the checkpoint loop left running
            with contextlib.suppress(Exception):
                await self._syncing
        if self.store.saved is not None:
            await self._save()
        await asyncio.to_thread(self.dequeuer.close)
        await asyncio.to_thread(self.store.close)

    def status(self) -> dpb.DeliveryStatus:
        return dpb.DeliveryStatus(
            timer_max_delay_ms=self.options.max_delay_ms,
            timer_precision_ms=self.store.geometry.precision_ms,
            active=self.active,
            timer_pending=max(0, self.store.pending),
            timer_delivered_to_ms=self.store.read_time_ms,
        )

    # -- loops -------------------------------------------------------------------------
    async def _guard(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``loop``; an unexpected error is logged and the loop started again."""
        failures = 0
        while not self._stopping:
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.exception("timer %s failed; starting it again", name)
                await asyncio.sleep(FAILURE_BACKOFF.delay_s(failures))

    async def _steps(self, name: str, step: Callable[[], Awaitable[float]]) -> None:
        """Run ``step`` while the storage is a master, pausing for what it returns (s);
        a Read the storage does not answer is retried with backoff, logged once."""
        failures = 0
        while True:
            await self._role.wait_active()  # at once beside a master
            try:
                pause_s = await step()
            except grpc.aio.AioRpcError as exc:
                failures += 1
                if failures == 1:
                    log.warning(
                        "timer %s: storage read failed (%s); retrying", name, exc.code().name
                    )
                await asyncio.sleep(FAILURE_BACKOFF.delay_s(failures))
                continue
            failures = 0
            # (0 still yields: catching up after a stop, empty slots fire without an
            # await of their own, and the RPCs must get in.)
            await asyncio.sleep(pause_s)

    async def _enqueue_step(self) -> float:
        moved = await self.enqueuer.step()
        return 0 if moved else IDLE_POLL_S

    async def _dequeue_step(self) -> float:
        if not self.dequeuer.due():
            return min(self.dequeuer.wait_ms() / 1000, DUE_POLL_MAX_S)
        await self.dequeuer.fire()
        return 0

    async def _checkpoint_loop(self) -> None:
        interval_s = self.options.checkpoint_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            if self.store.snapshot() != self.store.saved:
                await self._save()

    async def _save(self) -> None:
        """Record a checkpoint, delete the log segments no slot still to fire names, and
        copy the checkpoint to the storage. The sync runs on a thread, shielded: a stop
        waits for it rather than closing the files under it."""
        snapshot = self.store.snapshot()
        self._syncing = asyncio.ensure_future(asyncio.to_thread(self.store.save, snapshot))
        checkpoint = await asyncio.shield(self._syncing)
        self._syncing = None
        deleted = self.store.timer_log.delete_fired(snapshot.read_time_ms)
        if deleted:
            log.info("timer log: deleted %d segment(s) whose slots have all fired", deleted)
        await self._progress.copy(timer_checkpoint=checkpoint.pack())

    async def _revise_queue_offset(self) -> None:
        """After a corrupt log was cut: file the timer topic again from the message of the
        last unit kept (RocketMQ's ``reviseQueueOffset``)."""
        store = self.store
        end = store.timer_log.end
        if end <= store.timer_log.min_offset:
            store.queue_offset = 0
            return
        unit = store.timer_log.read_checked(end - TIMER_LOG_UNIT_BYTES)
        if unit is None:  # the log ends with a segment's blank: keep the recorded offset
            return
        try:
            results = await self._storage.read([(unit.commitlog_offset, unit.commitlog_size)])
        except grpc.aio.AioRpcError as exc:
            log.error("timer: cannot revise the queue offset (%s); keeping it", exc.code().name)
            return
        message = results[0].message
        if results[0].status == spb.FOUND and message.topic == TIMER_TOPIC:
            store.queue_offset = min(store.queue_offset, message.queue_offset + 1)
        log.warning("timer topic filed again from queue offset %d", store.queue_offset)

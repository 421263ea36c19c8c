"""The dispatch loop: follow the storage's commitlog and apply it to the DispatchStore.

Every store write (open, reconcile, apply, cleanup, close) runs on the store's one writer:
the writer thread, in order, or the event loop itself while the writer thread has nothing
queued or running. Each chunk's records travel as column-wise ``RecordBatch`` objects
(``TailFollower.batches``), never as an object per record.

Batches are applied on the event loop whenever the writer thread is idle: following
live, that saves the two thread hops (writer wake-up, loop wake-up) between a record's
arrival and its arrival notice; catching up, it saves the threads contending for the
GIL. With the follower finding the records on the loop and the writer thread applying
them, a replay cost ~0.5 us of CPU per record more (2.1 instead of 1.6, measured:
docs/benchmarks.md, "Dispatch"), the two threads handing the GIL and the batches back
and forth. A large batch is applied ``INLINE_APPLY_MAX_RECORDS`` records at a time, the
loop serving RPCs in between (a slice is ~3 ms of work); when the writer thread got work
meanwhile (a cleanup), the rest of the batch queues behind it.

Catching up, the Tail asks for chunks of ``TAIL_CHUNK_BYTES`` (the storage's default is
256 KiB): the per-chunk costs (a gRPC message, loop and writer wake-ups, GIL hand-offs)
were ~0.5 ms a chunk, a fifth of the CPU of a replay at 256 KiB chunks.

Following: ``TailFollower`` reconnects by itself when the storage restarts or the stream
breaks. When it gives up (OUT_OF_RANGE: the storage cut its tail below us or retention
deleted past us; a corrupt chunk; an unexpected status) or applying a batch fails, the
dispatcher asks the storage for its offsets again, reconciles and restarts the follower
from where the store says, backing off while failures repeat.

Each applied batch also goes to the tail cache (tail_cache.py), from which GetQueueEntries
answers the newest records' bytes; it is cleared whenever what it holds may no longer be
the storage's (a reconcile, a new follower, a reconnect).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc

from services.dispatch.arrivals import ArrivalHub
from services.dispatch.engine.dispatch_store import (
    DispatchDiskFullError,
    DispatchDivergedError,
    DispatchStore,
)
from services.dispatch.storage_client import StorageClient
from services.dispatch.tail_cache import TailCache
from tide.format import tags_code
from tide.server import cluster_channel_interceptors
from tide.tail import (
    Backoff,
    RecordBatch,
    TailError,
    TailFollower,
    TailOutOfRangeError,
    insecure_channel,
)
from tide.v1 import storage_pb2 as pb

log = logging.getLogger("tide.dispatch")
CATCH_UP_LOG_INTERVAL_S = 5.0
MAX_VERIFY_STEPS = 4096
CATCH_UP_LOG_MIN_LAG_BYTES = 16 << 20
# The Tail chunk size asked for (a chunk holds at most what is there to read). A replay
# measured the same at 4 MiB, ~10 % slower at 1 MiB, ~20 % at 256 KiB.
TAIL_CHUNK_BYTES = 2 << 20
# Records applied on the event loop at a time (~3 ms of work), the loop serving RPCs
# between two such slices of a batch.
INLINE_APPLY_MAX_RECORDS = 4096
_T = TypeVar("_T")

# While the disk is full, a batch is applied again this often (a statvfs per file it
# needs first: cheap while still full).
DISK_FULL_RETRY_S = 1.0
# A restart that then ran this long without failing resets the failure backoff.
HEALTHY_RUN_S = 30.0
RESTART_BACKOFF = Backoff(initial_s=0.2, max_s=10.0)


class Writer:
    """One thread that runs every store write, in submission order."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tide-dispatch-writer")
        self._submitted = 0  # counted on the event loop
        self._finished = 0  # counted on the writer thread, at the end of each call

    @property
    def idle(self) -> bool:
        """Nothing submitted is queued or running (ask on the event loop, which submits
        everything: while it does not await, nothing new can start)."""
        return self._finished == self._submitted

    async def run(self, fn: Callable[..., _T], *args: object) -> _T:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._call, fn, args)
        self._submitted += 1
        return await future

    def _call(self, fn: Callable[..., _T], args: tuple[object, ...]) -> _T:
        try:
            return fn(*args)
        finally:
            self._finished += 1

    def shutdown(self) -> None:
        """Wait for the queued work, then end the thread."""
        self._executor.shutdown(wait=True)


class Dispatcher:
    def __init__(
        self,
        store: DispatchStore,
        storage: StorageClient,
        hub: ArrivalHub,
        writer: Writer,
        *,
        cleanup_interval_s: float,
        verify_body_crc: bool = False,
        tail_cache_bytes: int = 0,
    ) -> None:
        self.store = store
        self.storage = storage
        self.hub = hub
        self._writer = writer
        self._cleanup_interval_s = cleanup_interval_s
        # Body CRCs are not checked by default, as RocketMQ's ReputMessageService does
        # not (checkMessageAndReturnSize(buffer, checkCRC=false, ...)): the storage checks
        # them in recovery. Every structural check of a record still applies.
        self.verify_body_crc = verify_body_crc
        # The newest applied records' bytes, which GetQueueEntries serves (tail_cache.py).
        self.tail_cache = TailCache(tail_cache_bytes)
        self._follower: TailFollower | None = None
        self._tail_channel: grpc.aio.Channel | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._phase = "starting"  # starting, following, reconciling, failed
        self.last_error = ""
        self.restarts = 0
        self._reconnects_before = 0  # of followers already replaced
        self._tail_max_before: int | None = None  # the last follower's max_offset

    # -- state -------------------------------------------------------------------
    @property
    def follower_state(self) -> str:
        """connected / reconnecting while following (disk_full while the store's disk is
        full: it holds its place); else the phase."""
        if self._phase != "following":
            return self._phase
        if self.store.disk_full is not None:
            return "disk_full"
        channel = self._tail_channel
        if channel is None:
            return "reconnecting"
        try:
            state = channel.get_state(try_to_connect=False)
        except Exception:  # a channel closed between attempts
            return "reconnecting"
        return "connected" if state is grpc.ChannelConnectivity.READY else "reconnecting"

    @property
    def tail_reconnects(self) -> int:
        follower = self._follower
        return self._reconnects_before + (follower.reconnects if follower else 0)

    @property
    def storage_max_seen(self) -> int | None:
        """The storage's max offset as last seen by the follower or a status call."""
        follower = self._follower
        last_status = self.storage.last_status
        seen = [
            offset
            for offset in (
                follower.max_offset if follower else self._tail_max_before,
                last_status.max_offset if last_status else None,
            )
            if offset is not None
        ]
        return max(seen) if seen else None

    # -- lifecycle ---------------------------------------------------------------
    async def reconcile(self, why: str) -> int:
        """Ask the storage for its offsets (until it answers) and reconcile the store;
        returns the commitlog offset to follow from."""
        self.tail_cache.clear()  # entries may be dropped, the commitlog was cut
        status = await self.storage.wait_status(why)
        await self._drop_entries_the_storage_lost(status.max_offset)
        offset = await self._writer.run(self.store.reconcile, status.min_offset, status.max_offset)
        log.info(
            "reconciled with storage %s (min %d, max %d): following from %d",
            self.storage.target,
            status.min_offset,
            status.max_offset,
            offset,
        )
        return offset

    async def _drop_entries_the_storage_lost(self, storage_max: int) -> None:
        """Our last entries must still name the same records in the storage: it may have
        truncated a torn tail and appended other records there while we were away. Walk
        back (bounded) from the last entry, dropping entries whose record is gone."""
        await self._check_durable_record(storage_max)
        for _ in range(MAX_VERIFY_STEPS):
            last = self.store.last_dispatched_entry()
            if last is None:
                return
            topic, queue_id, entry = last
            if entry.commitlog_offset + entry.size <= storage_max:
                (result,) = await self.storage.read([(entry.commitlog_offset, entry.size)])
                message = result.message
                if result.status == pb.FOUND and (
                    message.topic,
                    message.queue_id,
                    message.queue_offset,
                    tags_code(message.tags),
                ) == (topic, queue_id, entry.queue_offset, entry.tags_code):
                    return
            why = f"the storage no longer holds {topic}/{queue_id}@{entry.queue_offset} there"
            await self._writer.run(self.store.drop_from, entry.commitlog_offset, why)
        raise RuntimeError(f"more than {MAX_VERIFY_STEPS} dispatched records are gone")

    async def _check_durable_record(self, storage_max: int) -> None:
        """The last record our progress file names must still be in the storage, the
        same one (size, store time and body CRC): a record of the same size written
        there after a truncation would pass the queue entry checks."""
        record = self.store.durable_record
        if record is None:
            return
        same = False
        if record.offset + record.size <= storage_max:
            (result,) = await self.storage.read([(record.offset, record.size)])
            same = result.status == pb.FOUND and (
                result.message.store_timestamp_ms,
                result.message.body_crc,
            ) == (record.store_timestamp_ms, record.body_crc)
        if not same:
            why = f"the storage holds another record at {record.offset}"
            await self._writer.run(self.store.drop_from, record.offset, why)

    def start(self, offset: int) -> None:
        self._tasks = [
            asyncio.create_task(self._follow(offset), name="tide-dispatch-follow"),
            asyncio.create_task(self._cleanup_loop(), name="tide-dispatch-cleanup"),
        ]

    async def stop(self) -> None:
        """Stop following and cleaning; a batch being applied finishes on the writer."""
        for task in self._tasks:
            task.cancel()
        follower = self._follower
        if follower is not None:
            await follower.close()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    # -- following ---------------------------------------------------------------
    def _channel_factory(self, target: str) -> grpc.aio.Channel:
        channel = insecure_channel(target, cluster_channel_interceptors())
        self._tail_channel = channel
        return channel

    async def _follow(self, offset: int) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            error = await self._follow_once(offset)
            if error is None:
                return  # the follower was closed
            self.last_error = error
            if time.monotonic() - started >= HEALTHY_RUN_S:
                failures = 0
            failures += 1
            while True:
                if failures > 1:
                    self._phase = "failed"
                    await asyncio.sleep(RESTART_BACKOFF.delay_s(failures - 1))
                self._phase = "reconciling"
                try:
                    offset = await self.reconcile(f"restarting the Tail after: {error}")
                    break
                except Exception as exc:
                    log.exception("reconciling with storage %s failed", self.storage.target)
                    self.last_error = error = f"reconcile: {type(exc).__name__}: {exc}"
                    failures += 1
            self.restarts += 1

    def new_follower(self, offset: int) -> TailFollower:
        """The follower of the storage's commitlog from ``offset``."""
        return TailFollower(
            self.storage.target,
            offset,
            max_chunk_bytes=TAIL_CHUNK_BYTES,
            check_crc=self.verify_body_crc,
            channel_factory=self._channel_factory,
        )

    async def _follow_once(self, offset: int) -> str | None:
        """Follow from ``offset`` until something fails; returns what (None: closed)."""
        follower = self.new_follower(offset)
        self._follower = follower
        self._phase = "following"
        self.tail_cache.clear()  # the new follower may start below what it holds
        reconnects = follower.reconnects
        try:
            progress = _CatchUpLog(offset)
            async with follower, contextlib.aclosing(follower.batches()) as batches:
                async for batch in batches:
                    await self._apply(batch)
                    if follower.reconnects != reconnects:
                        reconnects = follower.reconnects
                        self.tail_cache.clear()  # the storage may have restarted meanwhile
                    self._cache(batch, follower.max_offset)
                    progress.update(self.store.dispatched_offset, follower.max_offset)
            return None
        except (TailOutOfRangeError, DispatchDivergedError) as exc:
            log.warning("%s; reconciling with the storage and following again", exc)
            return str(exc)
        except TailError as exc:
            log.error("following storage %s failed: %s; restarting", self.storage.target, exc)
            return str(exc)
        except Exception as exc:
            log.exception("dispatching from offset %d failed; restarting", follower.next_offset)
            return f"{type(exc).__name__}: {exc}"
        finally:
            self._follower = None
            self._tail_channel = None
            self._reconnects_before += follower.reconnects
            if follower.max_offset is not None:
                self._tail_max_before = follower.max_offset

    def _cache(self, batch: RecordBatch, storage_max: int | None) -> None:
        """Keep the applied ``batch`` in the tail cache, unless it is further behind the
        storage's max offset than the cache holds: catching up, it would be evicted before
        the dispatch is near the tail, so a replay pays nothing for the cache."""
        cache = self.tail_cache
        if storage_max is None or storage_max - batch.end_offset < cache.max_bytes:
            cache.add(batch)

    async def _apply(self, batch: RecordBatch) -> None:
        """Apply on the loop, a slice at a time, while the writer thread is idle; the
        rest on the writer thread once it is not. Arrivals are published per slice."""
        start = 0
        while start < len(batch) and self._writer.idle:
            stop = min(start + INLINE_APPLY_MAX_RECORDS, len(batch))
            part = batch if stop - start == len(batch) else batch.slice(start, stop)
            try:
                self.hub.publish(self.store.apply(part))
            except DispatchDiskFullError as exc:
                await self._hold_until_applied(part, exc)
            start = stop
            if start < len(batch):
                await asyncio.sleep(0)  # RPCs, and whatever else waits for the loop
        if start < len(batch):
            rest = batch.slice(start, len(batch)) if start else batch
            try:
                self.hub.publish(await self._writer.run(self.store.apply, rest))
            except DispatchDiskFullError as exc:
                await self._hold_until_applied(rest, exc)

    async def _hold_until_applied(self, part: RecordBatch, exc: DispatchDiskFullError) -> None:
        """The disk is full: stay at this batch (the follower is not read meanwhile, so
        the Tail stream is held by flow control) and apply it again every
        DISK_FULL_RETRY_S until it goes through (applying is idempotent); every other
        write goes on meanwhile (cleanup frees space). Not a failure: no reconcile, no
        restart, nothing rebuilt."""
        self.hub.publish(exc.arrivals)  # the queues it grew before the disk filled
        log.error("%s; retrying every %.0f s", exc, DISK_FULL_RETRY_S)
        self.last_error = str(exc)
        while True:
            await asyncio.sleep(DISK_FULL_RETRY_S)
            try:
                self.hub.publish(await self._writer.run(self.store.apply, part))
            except DispatchDiskFullError as again:
                self.hub.publish(again.arrivals)
                self.last_error = str(again)
                continue
            log.warning(
                "dispatch store %s has room again: dispatching from commitlog offset %d",
                self.store.config.store_dir,
                part.offsets[0],
            )
            return

    # -- cleanup -----------------------------------------------------------------
    async def _cleanup_loop(self) -> None:
        while True:
            await asyncio.sleep(self._cleanup_interval_s)
            try:
                status = await self.storage.status()
            except grpc.aio.AioRpcError as exc:
                log.debug("cleanup skipped: storage status: %s", exc.details())
                continue
            self.tail_cache.discard_below(status.min_offset)  # Storage/Read would not find it
            try:
                await self._writer.run(self.store.cleanup, status.min_offset)
            except Exception:
                log.exception("cleanup below commitlog offset %d failed", status.min_offset)


class _CatchUpLog:
    """Logs progress every ``CATCH_UP_LOG_INTERVAL_S`` while far behind the storage (a
    rebuild from the whole commitlog, or a long outage)."""

    def __init__(self, start_offset: int) -> None:
        self._start_offset = start_offset
        self._started = time.monotonic()
        self._last_log = self._started

    def update(self, dispatched: int, storage_max: int | None) -> None:
        now = time.monotonic()
        if storage_max is None or now - self._last_log < CATCH_UP_LOG_INTERVAL_S:
            return
        behind = storage_max - dispatched
        if behind < CATCH_UP_LOG_MIN_LAG_BYTES:
            return
        self._last_log = now
        done = dispatched - self._start_offset
        total = storage_max - self._start_offset
        rate = done / max(now - self._started, 1e-9)
        log.info(
            "catching up: dispatched %d of %d bytes (%.0f%%), %.1f MB/s, %d bytes behind",
            done,
            total,
            100 * done / max(total, 1),
            rate / 1e6,
            behind,
        )

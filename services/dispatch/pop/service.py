"""The POP service: Receive's checkpoints, Ack, ChangeInvisibleDuration, dead-lettering
and lag, beside the consume queues (issue 20, docs/pop.md; RocketMQ's
PopMessageProcessor, AckMessageProcessor, ChangeInvisibleTimeProcessor).

* Active only beside a master (the delivery services' RoleWatcher). On becoming master
  (the first call or revive round after) it waits for the dispatch to reach the
  storage's end, then reads the revive log (``rmq_sys_REVIVE_LOG`` queue 0) from the
  revive progress (the offset of ``CID_RMQ_SYS_REVIVE_GROUP`` in the storage's offset
  table): every checkpoint not followed by its ack is held again, and each queue's pop
  offset is raised past the checkpoints found, so a message handed out before a crash
  is not handed out again while its checkpoint stands (revive.py delivers it again once
  its invisible time passes).
* A pop writes its checkpoints (one checkpoint run record for up to
  CHECKPOINT_RUN_MAX_COUNT messages, one Append for the call) before it answers; the
  i-th message's checkpoint is named run_checkpoint_id(the record's revive offset, i);
  an ack, a change or a dead-lettering writes its ack record (and the new
  checkpoint or the dead letter) in one Append.
* Pop offsets and the revive progress are written back to the storage's offset table
  every ``offset_flush_interval_ms`` (offsets first: the progress never passes a
  checkpoint whose pop offset is not written back) and on stop.
* One lock orders every change (pops, acks, revives): simple and safe; a busy broker's
  pops wait for each other's Append (docs/pop.md, "Known limits"). Acks, changes and lag:
  handles.py; redelivery: revive.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from services.dispatch.cold_entries import page_in
from services.dispatch.delivery.role import RoleWatcher
from services.dispatch.engine.consume_queue import Entry
from services.dispatch.engine.consume_queue_store import ConsumeQueueStore
from services.dispatch.pop.records import checkpoint_run_ids, checkpoint_runs
from services.dispatch.pop.state import PopOptions, PopState, QueueKey, key_of
from services.dispatch.pop.stored import read_messages
from services.dispatch.storage_client import AppendedRun, StorageClient
from services.dispatch.tail_cache import TailCache
from tide.format import (
    ACK_REASON_ACK,
    ACK_TAG,
    CHECKPOINT_TAG,
    CHECKPOINTS_TAG,
    REVIVE_GROUP,
    REVIVE_QUEUE_ID,
    REVIVE_TOPIC,
    PopCheckpoint,
    PopRecordError,
    decode_ack,
    decode_checkpoint,
    decode_checkpoints,
    pop_retry_topic,
    run_checkpoint_id,
    tags_code,
)
from tide.server import ColdReads, ServiceError
from tide.v1 import dispatch_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import WaitTimeout, wait_until_async

log = logging.getLogger("tide.dispatch.pop")

CATCH_UP_TIMEOUT_S = 30.0
SCAN_BATCH_ENTRIES = 256  # revive log entries read per Read at recovery
MIN_FILTER_SCAN_ENTRIES = 800  # entries a tag-filtered pop looks at per queue at least
MAX_POP_MESSAGES = 1_024
# Record bytes one PopMessages answers at most (the first message always): the answer is
# built in memory and must fit gRPC's message limit with room (a Pull's --max-pull-bytes
# default is 4 MiB; a Receive asks for fewer, larger batches).
POP_ANSWER_MAX_BYTES = 8 << 20
RETRY_FIRST_EVERY = 2  # every 2nd pop reads the POP retry topic first (docs/pop.md)
_T = TypeVar("_T")
Candidate = tuple[QueueKey, Entry, storage_pb.StoredMessage, int, bool]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class PopService:
    def __init__(
        self,
        *,
        queues: ConsumeQueueStore,
        storage: StorageClient,
        role: RoleWatcher,
        dispatched: Callable[[], int],
        options: PopOptions,
        tail_cache: TailCache | None = None,
        cold_reads: ColdReads | None = None,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        self.queues = queues
        # Entries far behind a queue's end are brought into memory off the loop first
        # (cold_entries.py); None: read as they are (tests without a cold reader).
        self.cold_reads = cold_reads
        self.tail_cache = tail_cache
        self.storage = storage
        self.role = role
        self._dispatched = dispatched
        self.options = options
        self.clock_ms = clock_ms
        self.lock = asyncio.Lock()
        self.state = PopState(checkpoints_max=options.checkpoints_max)
        self._ready = False
        self._saved_progress = -1
        self._pops = 0
        self.received = 0  # messages handed out (metrics)
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -----------------------------------------------------------------
    async def start(self, revive: Callable[[], Awaitable[None]]) -> None:
        self._tasks = [
            asyncio.create_task(self._every(self.options.offset_flush_interval_ms, self.flush)),
            asyncio.create_task(self._every(self.options.revive_interval_ms, revive)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(ServiceError, grpc.aio.AioRpcError):
            await self.flush()
        await self.storage.close()

    async def _every(self, interval_ms: int, work: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                if self.role.active:
                    await work()
                elif self._ready:
                    async with self.lock:  # a slave now: hold nothing (reloaded as master)
                        self._ready = False
                        self.state.clear()
            except (ServiceError, grpc.aio.AioRpcError) as exc:
                log.warning("pop background work failed (next round retries): %s", exc)
            except Exception:  # a bug must not end the revives and flushes for good
                log.exception("pop background work failed (next round retries)")

    # -- recovery --------------------------------------------------------------------
    async def ready(self) -> None:
        """Called with the lock held: the master's state is loaded."""
        if not self.role.active and not await self.role.refresh():
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this dispatch follows a slave; POP calls go to the broker's master",
            )
        if self._ready:
            return
        target = (await self.call(self.storage.status())).max_offset
        try:
            await wait_until_async(
                lambda: self._dispatched() >= target,
                "the dispatch to reach the storage's end",
                timeout_s=CATCH_UP_TIMEOUT_S,
            )
        except WaitTimeout:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                f"the dispatch is still catching up with the storage (at {self._dispatched()} "
                f"of {target}); retry shortly",
            ) from None
        self.state.clear()
        progress = await self.call(self.storage.get_offset(REVIVE_GROUP, REVIVE_TOPIC, 0))
        await self._read_revive_log(max(progress, 0))
        self._saved_progress = progress
        self._ready = True
        log.info(
            "pop: revive log read from %d to %d, %d checkpoints held",
            max(progress, 0),
            self.state.revive_end,
            len(self.state.held),
        )

    async def _read_revive_log(self, start: int) -> None:
        queue = self.queues.find(REVIVE_TOPIC, REVIVE_QUEUE_ID)
        state = self.state
        if queue is None:
            return
        offset = max(start, queue.min_offset)
        state.revive_end = offset
        raised: dict[QueueKey, int] = {}
        while offset < queue.max_offset:
            entries = [e for e in queue.get(offset, SCAN_BATCH_ENTRIES) if not e.is_pre_blank]
            if not entries:
                break
            results = await self.call(
                self.storage.read([(e.commitlog_offset, e.size) for e in entries])
            )
            for entry, result in zip(entries, results, strict=True):
                if result.status == storage_pb.FOUND:
                    self._replay(entry.queue_offset, result.message, raised)
            offset = entries[-1].queue_offset + 1
            state.revive_end = offset
        for key, end in raised.items():
            stored = await self.stored_offset(key)
            state.next[key] = max(stored, end)
        for key, acked in state.fifo_acked.items():
            low = min((state.held[o].queue_offset for o in state.by_queue.get(key, ())), default=0)
            acked.difference_update({o for o in acked if o < low})

    def _replay(
        self, offset: int, message: storage_pb.StoredMessage, raised: dict[QueueKey, int]
    ) -> None:
        try:
            if message.tags == CHECKPOINTS_TAG:
                for index, ck in enumerate(decode_checkpoints(message.body)):
                    self._replay_checkpoint(run_checkpoint_id(offset, index), ck, raised)
            elif message.tags == CHECKPOINT_TAG:
                self._replay_checkpoint(offset, decode_checkpoint(message.body), raised)
            elif message.tags == ACK_TAG:
                ack = decode_ack(message.body)
                for resolved in ack.offsets:
                    ck_or_none = self.state.resolve(resolved)
                    if ck_or_none is not None and ck_or_none.fifo and ack.reason == ACK_REASON_ACK:
                        acked = self.state.fifo_acked.setdefault(key_of(ck_or_none), set())
                        acked.add(ck_or_none.queue_offset)
        except PopRecordError as exc:
            log.warning("revive log record at queue offset %d skipped: %s", offset, exc)

    def _replay_checkpoint(
        self, checkpoint_id: int, ck: PopCheckpoint, raised: dict[QueueKey, int]
    ) -> None:
        self.state.add(checkpoint_id, ck)
        key = key_of(ck)
        raised[key] = max(raised.get(key, 0), ck.queue_offset + 1)

    async def stored_offset(self, key: QueueKey) -> int:
        group, topic, queue_id = key
        return await self.call(self.storage.get_offset(group, topic, queue_id))

    async def next_offset(self, key: QueueKey, min_offset: int) -> int:
        offset = self.state.next.get(key)
        if offset is None:
            stored = await self.stored_offset(key)
            # A group new to the queue starts at its first message (docs/pop.md).
            offset = stored if stored >= 0 else min_offset
            self.state.next[key] = offset
        return max(offset, min_offset)

    async def flush(self) -> None:
        """Write the pop offsets changed, then the revive progress (see the module doc)."""
        async with self.lock:
            if not self._ready:
                return
            progress = self.state.progress()
            dirty, self.state.dirty = self.state.dirty, set()
            try:
                for key in sorted(dirty):
                    group, topic, queue_id = key
                    await self.storage.commit_offset(group, topic, queue_id, self.state.next[key])
            except grpc.aio.AioRpcError:
                self.state.dirty |= dirty
                raise
            if progress != self._saved_progress:
                await self.storage.commit_offset(REVIVE_GROUP, REVIVE_TOPIC, 0, progress)
                self._saved_progress = progress

    # -- pop ---------------------------------------------------------------------------
    async def pop(self, request: pb.PopMessagesRequest) -> pb.PopMessagesResponse:
        _check_pop(request)
        async with self.lock:
            await self.ready()
            now = self.clock_ms()
            until = now + request.invisible_duration_ms
            taken: list[Candidate] = []
            passed: dict[QueueKey, int] = {}
            for topic, retry, queue_ids in self._sources(request):
                for queue_id in queue_ids:
                    remaining = request.max_messages - len(taken)
                    if remaining <= 0:
                        break
                    key = (request.consumer_group, topic, queue_id)
                    room_bytes = POP_ANSWER_MAX_BYTES - sum(c[1].size for c in taken)
                    taken.extend(
                        await self._take(
                            key, request, remaining, retry, passed, room_bytes, not taken
                        )
                    )
            response = self._ends(request, now)
            if not taken:
                self._pass(passed)
                return response
            self.state.check_room(len(taken))
            cks = [self._checkpoint(c, request, until) for c in taken]
            records = checkpoint_runs(cks, now)
            appended = await self.append(b"".join(records), len(records))
            ids = checkpoint_run_ids(appended.queue_offsets, len(cks))
            for candidate, ck, offset in zip(taken, cks, ids, strict=True):
                key, entry, stored, attempt, retry = candidate
                self.state.fifo_attempts.pop((key, entry.queue_offset), None)
                self.state.add(offset, ck)
                if entry.queue_offset + 1 > self.state.next.get(key, 0):
                    self.state.advance(key, entry.queue_offset + 1)
                response.messages.append(
                    pb.PoppedMessage(
                        checkpoint_offset=offset,
                        message=stored,
                        delivery_attempt=attempt,
                        invisible_until_ms=until,
                        retry=retry,
                    )
                )
            self._pass(passed)
            self.received += len(taken)
            return response

    def _ends(self, request: pb.PopMessagesRequest, now: int) -> pb.PopMessagesResponse:
        response = pb.PopMessagesResponse(pop_timestamp_ms=now)
        for queue_id in request.queue_ids:
            queue = self.queues.find(request.topic, queue_id)
            response.max_offsets.append(queue.max_offset if queue is not None else 0)
        if request.with_retry:
            retry = self.queues.find(retry_topic_of(request.consumer_group, request.topic), 0)
            response.retry_max_offset = retry.max_offset if retry is not None else 0
        return response

    def _pass(self, passed: dict[QueueKey, int]) -> None:
        """Move pop offsets past the entries passed over (only once the checkpoints of
        the messages before them are written)."""
        for key, end in passed.items():
            if end > self.state.next.get(key, 0):
                self.state.advance(key, end)

    def _sources(self, request: pb.PopMessagesRequest) -> list[tuple[str, bool, list[int]]]:
        """The topic's queues (from a queue that turns each call, so every queue gets its
        turn) and, unless FIFO, the POP retry topic: first on every RETRY_FIRST_EVERY-th
        pop, last on the others."""
        self._pops += 1
        ids = list(request.queue_ids)
        turn = self._pops % len(ids)
        sources = [(request.topic, False, ids[turn:] + ids[:turn])]
        if request.with_retry and not request.fifo:
            retry = (retry_topic_of(request.consumer_group, request.topic), True, [0])
            if self._pops % RETRY_FIRST_EVERY == 0:
                sources.insert(0, retry)
            else:
                sources.append(retry)
        return sources

    async def _take(
        self,
        key: QueueKey,
        request: pb.PopMessagesRequest,
        remaining: int,
        retry: bool,
        passed: dict[QueueKey, int],
        room_bytes: int,
        first: bool,
    ) -> list[Candidate]:
        """Up to ``remaining`` messages of one queue matching the tags, of at most
        ``room_bytes`` of records (one at least when ``first``: the call's first); the
        queue's pop offset moves past those passed over (a mismatched tag: never handed
        out)."""
        queue = self.queues.find(key[1], key[2])
        if queue is None or (request.fifo and self.state.inflight(key)):
            return []
        offset = await self.next_offset(key, queue.min_offset)
        acked = self.state.fifo_acked.get(key)
        if acked:
            acked.difference_update({o for o in acked if o < offset})
        wanted = set(request.tags)
        codes = {tags_code(tag) for tag in wanted}
        scan = max(remaining, MIN_FILTER_SCAN_ENTRIES) if wanted else remaining
        await page_in(self.cold_reads, queue, offset, scan)
        entries = queue.get(offset, scan)
        if not entries:
            return []
        picked: list[Entry] = []
        end = entries[-1].queue_offset + 1
        for entry in entries:
            if entry.is_pre_blank or (codes and entry.tags_code not in codes):
                continue
            if acked and entry.queue_offset in acked:
                continue
            full = len(picked) == remaining or room_bytes - entry.size < 0
            if full and (picked or not first):
                end = entry.queue_offset  # the rest: the next pop
                break
            picked.append(entry)
            room_bytes -= entry.size
        messages = await self.call(read_messages(picked, self.tail_cache, self.storage))
        taken: list[Candidate] = []
        for entry, message in zip(picked, messages, strict=True):
            if message is None or (wanted and message.tags not in wanted):
                continue  # removed by retention, or another tag of the same hash code
            attempt = message.reconsume_times + 1
            if request.fifo:
                attempt = self.state.fifo_attempts.get((key, entry.queue_offset), 0) + 1
            taken.append((key, entry, message, attempt, retry))
        passed[key] = end  # the entries looked at and not taken: never handed out
        return taken

    @staticmethod
    def _checkpoint(c: Candidate, request: pb.PopMessagesRequest, until: int) -> PopCheckpoint:
        key, entry, _, attempt, _ = c
        return PopCheckpoint(
            group=key[0],
            topic=key[1],
            queue_id=key[2],
            queue_offset=entry.queue_offset,
            physical_offset=entry.commitlog_offset,
            size=entry.size,
            attempt=attempt,
            invisible_until_ms=until,
            fifo=request.fifo,
            origin_topic=request.topic,
        )

    # -- storage -------------------------------------------------------------------------
    async def append(self, run: bytes, count: int) -> AppendedRun:
        return await self.call(self.storage.append_run(run, count))

    @staticmethod
    async def call(call: Awaitable[_T]) -> _T:
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise ServiceError(exc.code(), f"storage: {exc.details()}") from exc


def retry_topic_of(group: str, topic: str) -> str:
    """The group's POP retry topic of ``topic``; INVALID_ARGUMENT when the two names are
    too long together for one."""
    try:
        return pop_retry_topic(group, topic)
    except ValueError as exc:
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None


def _check_pop(request: pb.PopMessagesRequest) -> None:
    if not 1 <= request.max_messages <= MAX_POP_MESSAGES:
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"max_messages must be in 1..{MAX_POP_MESSAGES} (got {request.max_messages})",
        )
    if not request.queue_ids:
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "queue_ids is empty; name the queues")
    if request.invisible_duration_ms <= 0:
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"invisible_duration_ms must be > 0 (got {request.invisible_duration_ms})",
        )

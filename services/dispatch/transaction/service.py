"""The transaction service: EndTransaction, check-back and the halves' bookkeeping.

RocketMQ's TransactionalMessageServiceImpl + EndTransactionProcessor +
TransactionalMessageCheckService, in the dispatch beside the half and op queues
(decision 2 of issue 19), active only beside a master.

* Resolution: ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` queue 0 holds one op record per resolved
  half (body: the half's queue offset; TRAN_RESOLUTION: commit, rollback or discard). The
  service reads every op record once (after a start, only once the dispatch has caught
  up with the storage's end as it was then: op records written before a crash are in
  the op queue before any new resolution is decided) and adds its own as it writes them.
  Resolutions are decided one batch at a time (a lock; batch.py): the EndTransactions
  that arrive while a batch is written form the next, a batch takes a half at most once,
  so a half is resolved once.
* A commit writes the real copy (REAL_TOPIC / REAL_QID removed, sys_flag COMMIT, the
  half's commitlog offset as prepared transaction offset) and the op record; a batch
  reads its halves in one Read and writes every copy and op record in ONE Append: the
  store writes a run whole or not at all, so after any crash either all exist (each
  half reads as resolved: no second copy) or none (they are still pending). A half just
  written is read from the dispatch's tail cache, not the storage.
* Check-back: every half unresolved for ``check_interval_ms`` since it was stored (or
  last checked) gets its check count raised (saved in ``config/transactionChecks.json``
  of the dispatch's store dir) and waits for a gateway holding a TransactionChecks stream
  of its producer group to take it (TakeTransactionChecks). Past ``check_max`` checks a
  half is discarded (an op record ``discard``, logged) or, with ``keep_after_max``, kept
  unresolved and no longer checked (logged). The counts are copied to the storage
  (SaveDeliveryProgress), so a slave holds them with its other metadata.
* Bounds (state.py): at most ``--transaction-halves-max`` unresolved halves held (later
  ones are read from the half queue when older ones go) and RESOLVED_MAX resolutions
  above the oldest open half (past it: RESOURCE_EXHAUSTED on EndTransaction).
* Storage: a StorageClient of its own and the delivery services' RoleWatcher.
* Metrics (services/dispatch/metrics.py): ``resolved`` counts the resolutions this
  service wrote since start (commit, rollback, discard), ``checks`` the check counts it
  raised; :meth:`held` the unresolved halves it holds and those kept past the maximum.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import grpc

from services.dispatch.cold_entries import page_in
from services.dispatch.delivery.progress import ProgressCopy
from services.dispatch.delivery.role import RoleWatcher
from services.dispatch.engine.consume_queue import Entry
from services.dispatch.engine.consume_queue_store import ConsumeQueueStore
from services.dispatch.storage_client import StorageClient
from services.dispatch.tail_cache import TailCache
from services.dispatch.transaction.batch import (
    END_BATCH_MAX_BYTES,
    END_BATCH_MAX_COUNT,
    END_PENDING_MAX,
    Ending,
    EndRun,
    end_response,
    log_resolution,
)
from services.dispatch.transaction.records import op_record
from services.dispatch.transaction.state import (
    HalfInfo,
    TransactionOptions,
    TransactionState,
    unknown_half,
)
from services.dispatch.transaction.storage_io import HalfStore, call_storage, gone
from tide.files import load_json_with_fallback, write_json_atomically
from tide.format import (
    PGROUP,
    RESOLUTION_COMMIT,
    RESOLUTION_DISCARD,
    RESOLUTION_ROLLBACK,
    TRAN_RESOLUTION,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANSACTION_CHECKS_FILE,
    TRANSACTION_ID,
    decode_record,
    decode_transaction_checks,
    encode_transaction_checks,
    make_msg_id,
    msg_id_prefix,
    parse_op_body,
)
from tide.quoting import quote
from tide.server import ColdReads, ServiceError
from tide.v1 import dispatch_pb2 as pb
from tide.waiting import WaitTimeout, wait_until_async

log = logging.getLogger("tide.dispatch.transaction")

CATCH_UP_TIMEOUT_S = 30.0
"""Longest wait for the dispatch to reach the storage's end before a first resolution."""
HALF_WAIT_S = 5.0
"""Longest wait for a half just written to reach the half queue."""
SCAN_BATCH_ENTRIES = 256
SCAN_MAX_ENTRIES = 100_000
"""Most half queue entries one check round looks at (the rest: next round)."""
DUE_MAX_PER_GROUP = 10_000
"""Most halves waiting for a producer group's check stream (more wait a round)."""
CHECK_ROUND_MAX_S = 1.0
CONFIG_DIR = "config"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _error(code: grpc.StatusCode, message: str) -> ServiceError:
    return ServiceError(code, message)


class TransactionService:
    def __init__(
        self,
        *,
        queues: ConsumeQueueStore,
        storage: StorageClient,
        role: RoleWatcher,
        store_dir: Path,
        dispatched: Callable[[], int],
        options: TransactionOptions,
        tail_cache: TailCache | None = None,
        cold_reads: ColdReads | None = None,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        self._queues = queues
        # The half and op queues are read from where the scans stand, which may be far
        # behind their ends (halves held back past the bound, a restart): such entries
        # are brought into memory off the loop first (cold_entries.py).
        self._cold_reads = cold_reads
        # (an empty cache is falsy: it has a length)
        self._io = HalfStore(storage, TailCache(0) if tail_cache is None else tail_cache)
        self._storage = storage
        self._role = role
        # Slaves get the check counts with the rest of the metadata (through the storage).
        self._copy = ProgressCopy(storage, role, "transaction check counts")
        self._path = store_dir / CONFIG_DIR / TRANSACTION_CHECKS_FILE
        self._dispatched = dispatched
        self.options = options
        self._clock_ms = clock_ms
        self._lock = asyncio.Lock()
        self._pending: deque[Ending] = deque()  # EndTransactions waiting for a batch
        self._resolver: asyncio.Task[None] | None = None
        self._state = TransactionState(halves_max=options.halves_max)
        self._ready = False
        self._task: asyncio.Task[None] | None = None
        # Metrics: resolutions written (not those read back from the op queue), checks.
        self.resolved = {RESOLUTION_COMMIT: 0, RESOLUTION_ROLLBACK: 0, RESOLUTION_DISCARD: 0}
        self.checks = 0

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        document, _ = await asyncio.to_thread(load_json_with_fallback, self._path)
        if document is not None:
            self._state.checks = decode_transaction_checks(document)
        self._task = asyncio.create_task(self._check_periodically())
        log.info(
            "transactions: check interval %d ms, at most %d checks, then %s",
            self.options.check_interval_ms,
            self.options.check_max,
            "kept" if self.options.keep_after_max else "discarded",
        )

    async def stop(self) -> None:
        if self._resolver is not None:
            self._resolver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resolver
        self._io.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._storage.close()

    # -- EndTransaction --------------------------------------------------------------
    async def end(
        self, request: pb.DispatchEndTransactionRequest
    ) -> pb.DispatchEndTransactionResponse:
        # A cached "slave" is asked again: a master just started answers on its first ask.
        if not self._role.active and not await self._role.refresh():
            raise _error(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this dispatch follows a slave; end the transaction on the broker's master",
            )
        if len(self._pending) >= END_PENDING_MAX:
            raise _error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{len(self._pending)} EndTransactions wait on this broker, the bound "
                f"END_PENDING_MAX ({END_PENDING_MAX}); retry shortly (nothing was written)",
            )
        ending = Ending(request, asyncio.get_running_loop().create_future())
        self._pending.append(ending)
        if self._resolver is None or self._resolver.done():
            self._resolver = asyncio.create_task(self._resolve_pending())
        return await ending.future

    async def _resolve_pending(self) -> None:
        """Resolve the waiting EndTransactions batch after batch (see batch.py): those that
        arrive while one batch is written form the next."""
        while self._pending:
            batch: list[Ending] = []
            try:
                async with self._lock:
                    batch = self._take_batch()
                    if batch:
                        self._pending.extendleft(reversed(await self._resolve_batch(batch)))
            except asyncio.CancelledError:  # stop(): a future cannot take a cancellation
                stopping = _error(grpc.StatusCode.UNAVAILABLE, "the dispatch stops; retry")
                for ending in (*batch, *self._pending):
                    ending.fail(stopping)
                self._pending.clear()
                raise
            except Exception as exc:  # the batch's answer; the next batch goes on
                for ending in batch:
                    ending.fail(exc)

    def _take_batch(self) -> list[Ending]:
        batch: list[Ending] = []
        while self._pending and len(batch) < END_BATCH_MAX_COUNT:
            ending = self._pending.popleft()
            if not ending.future.done():  # its caller gave up before anything was written
                batch.append(ending)
        return batch

    async def _resolve_batch(self, batch: list[Ending]) -> list[Ending]:
        """Resolve what the batch can (one Read, one Append); the endings left for the next
        batch (a half already taken by this one, or past its bytes) are returned."""
        await self._catch_up()
        later: list[Ending] = []
        taken: list[tuple[Ending, Entry]] = []
        offsets: set[int] = set()
        batch_bytes = 0
        for ending in batch:
            if ending.offset in offsets:  # decided by this batch: the next one refuses it
                later.append(ending)
                continue
            try:
                entry = await self._open_half(ending, pending=len(offsets))
            except ServiceError as exc:
                ending.fail(exc)
                continue
            if taken and batch_bytes + entry.size > END_BATCH_MAX_BYTES:
                later.append(ending)
                continue
            batch_bytes += entry.size
            offsets.add(ending.offset)
            taken.append((ending, entry))
        if taken:
            await self._write_batch(taken)
        return later

    async def _open_half(self, ending: Ending, *, pending: int) -> Entry:
        """The entry of the unresolved half the ending names; ServiceError if resolved,
        unknown or past the bounds."""
        offset = ending.offset
        done = self._state.resolution(offset)
        if done is not None:
            raise _error(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the transaction of the half message at queue offset {offset} was "
                f"resolved already{done}; nothing was written again",
            )
        self._state.check_room(offset, pending=pending)
        return await self._half_entry(offset, ending.request.physical_offset)

    async def _write_batch(self, taken: list[tuple[Ending, Entry]]) -> None:
        records = await self._io.halves([entry for _, entry in taken])
        run = EndRun()
        for (ending, entry), data in zip(taken, records, strict=True):
            try:
                if data is None:
                    raise gone(entry)
                record = decode_record(data, 0, len(data), expected_offset=entry.commitlog_offset)
                run.add(ending, record, entry.commitlog_offset)
            except ServiceError as exc:
                ending.fail(exc)
        if not run.resolved:
            return
        try:
            appended = await self._io.append(run.data(), run.count)
        except ServiceError:
            # Perhaps written (a timeout, a lost answer): read the op queue again up to
            # the storage's end before deciding anything else.
            self._ready = False
            raise
        counted = False
        for resolved in run.resolved:  # op records in run order: consecutive op offsets
            self._state.own_op_written(appended.queue_offsets[resolved.op_index])
            self.resolved[resolved.resolution] += 1
            counted |= self._state.resolve(resolved.ending.offset, resolved.resolution)
        if counted:
            await self._save_checks()
        for resolved in run.resolved:
            log_resolution(resolved)
            resolved.ending.answer(end_response(resolved, appended))

    async def _catch_up(self) -> None:
        """Every op record written so far is known (see the module doc)."""
        if not self._ready:
            target = (await call_storage(self._storage.status())).max_offset
            try:
                await wait_until_async(
                    lambda: self._dispatched() >= target,
                    "the dispatch to reach the storage's end",
                    timeout_s=CATCH_UP_TIMEOUT_S,
                )
            except WaitTimeout:
                raise _error(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the dispatch is still catching up with the storage (at "
                    f"{self._dispatched()} of {target}); retry shortly",
                ) from None
            self._ready = True
        await self._read_ops()

    async def _read_ops(self) -> None:
        queue = self._queues.find(TRANS_OP_HALF_TOPIC, 0)
        if queue is None:
            return
        state = self._state
        state.op_next = max(state.op_next, queue.min_offset)
        while state.op_next < queue.max_offset:
            await page_in(self._cold_reads, queue, state.op_next, SCAN_BATCH_ENTRIES)
            entries = queue.get(state.op_next, SCAN_BATCH_ENTRIES)
            if not entries:
                break
            for entry in entries:
                state.op_next = entry.queue_offset + 1
                if entry.is_pre_blank:
                    continue
                record = await self._io.read(entry)
                try:
                    half_offset = parse_op_body(record.body)
                except ValueError as exc:
                    log.warning("op record at queue offset %d skipped: %s", entry.queue_offset, exc)
                    continue
                how = record.properties.get(TRAN_RESOLUTION, RESOLUTION_ROLLBACK)
                await self._resolved(half_offset, how, save=False)

    async def _resolved(self, offset: int, how: str, *, save: bool = True) -> None:
        if self._state.resolve(offset, how) and save:
            await self._save_checks()

    async def _half_entry(self, offset: int, physical_offset: int) -> Entry:
        queue = self._queues.find(TRANS_HALF_TOPIC, 0)
        if offset < 0 or (queue is not None and offset < queue.min_offset):
            raise unknown_half(offset)
        if queue is None or offset >= queue.max_offset:
            # Written but not dispatched yet: wait for the dispatch to pass it.
            with contextlib.suppress(WaitTimeout):
                await wait_until_async(
                    lambda: self._dispatched() > physical_offset,
                    "the half message to be dispatched",
                    timeout_s=HALF_WAIT_S,
                )
            queue = self._queues.find(TRANS_HALF_TOPIC, 0)
        if queue is not None:
            await page_in(self._cold_reads, queue, offset, 1)
        entry = queue.entry_at(offset) if queue is not None else None
        if entry is None or entry.is_pre_blank:
            raise unknown_half(offset)
        if physical_offset and entry.commitlog_offset != physical_offset:
            raise _error(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"msg_id names commitlog offset {physical_offset}, but the half message at "
                f"queue offset {offset} is at {entry.commitlog_offset}: give the half's "
                "ProduceResult as it was returned",
            )
        return entry

    async def _save_checks(self) -> None:
        """Write the check counts locally (the truth), then copy them to the storage for
        the slaves (a failed copy is logged; the next save copies again)."""
        document = encode_transaction_checks(self._state.checks)
        # Small (one entry per half checked and unresolved): written in the loop's thread.
        write_json_atomically(self._path, document)
        await self._copy.copy(transaction_checks_json=json.dumps(document).encode("utf-8"))

    def held(self) -> tuple[int, int]:
        """(unresolved halves held, of them kept past their last check): a metric. At
        most --transaction-halves-max are held; later ones wait in the half queue."""
        return len(self._state.halves), len(self._state.kept)

    # -- check-back --------------------------------------------------------------------
    async def take_checks(self, group: str, max_count: int) -> list[pb.HalfEntry]:
        """The group's halves due for a check, read now (the due list holds offsets only:
        its memory does not grow with the bodies)."""
        taken: list[pb.HalfEntry] = []
        for offset in self._state.take_checks(group, max_count):
            half = self._state.halves.get(offset)
            entry = None if half is None else await self._entry_of(offset, half)
            if entry is not None:
                taken.append(entry)
        return taken

    async def list_halves(self, group: str, max_count: int) -> list[pb.HalfEntry]:
        """Unresolved halves (of ``group``, or all), oldest first."""
        async with self._lock:
            await self._catch_up()
            await self._see_halves()
        listed: list[pb.HalfEntry] = []
        for offset in sorted(self._state.halves):
            half = self._state.halves[offset]
            if group and half.group != group:
                continue
            entry = await self._entry_of(offset, half)
            if entry is not None:
                listed.append(entry)
            if len(listed) >= max_count:
                break
        return listed

    async def _entry_of(self, offset: int, half: HalfInfo) -> pb.HalfEntry | None:
        raw = await self._io.read_raw(half.physical_offset, half.size)
        if raw is None:
            return None
        record = decode_record(raw, 0, len(raw), expected_offset=half.physical_offset)
        return pb.HalfEntry(
            queue_offset=offset,
            physical_offset=half.physical_offset,
            record=raw,
            checks=self._state.checks.get(offset, 0),
            msg_id=make_msg_id(msg_id_prefix(record.store_host), half.physical_offset),
        )

    async def _see_halves(self) -> None:
        """Learn the halves written since the last look (their group and store time)."""
        queue = self._queues.find(TRANS_HALF_TOPIC, 0)
        if queue is None:
            return
        state = self._state
        state.half_next = max(state.half_next, state.check_from, queue.min_offset)
        end = min(queue.max_offset, state.half_next + SCAN_MAX_ENTRIES)
        # Past HALVES_MAX the later halves stay in the half queue: read here again once
        # older ones are resolved (half_next stays at the first one not held).
        while state.half_next < end and not state.halves_full():
            await page_in(self._cold_reads, queue, state.half_next, SCAN_BATCH_ENTRIES)
            entries = queue.get(state.half_next, SCAN_BATCH_ENTRIES)
            if not entries:
                break
            for entry in entries:
                if state.halves_full():
                    break
                state.half_next = entry.queue_offset + 1
                if entry.is_pre_blank or entry.queue_offset in state.resolved:
                    continue
                record = await self._io.read_record(entry.commitlog_offset, entry.size)
                if record is None:
                    continue
                store_ms = record.store_timestamp_ms
                state.halves[entry.queue_offset] = HalfInfo(
                    entry.commitlog_offset,
                    entry.size,
                    record.properties.get(PGROUP, ""),
                    store_ms,
                    store_ms,
                )

    async def _check_periodically(self) -> None:
        interval_s = min(CHECK_ROUND_MAX_S, self.options.check_interval_ms / 1000)
        while True:
            await asyncio.sleep(interval_s)
            try:
                if self._role.active:
                    await self.check_round()
            except (ServiceError, grpc.aio.AioRpcError) as exc:
                log.warning("transaction check round failed (next round retries): %s", exc)

    async def check_round(self) -> None:
        """Raise the check count of each half due and offer it to its group's streams."""
        async with self._lock:
            await self._catch_up()
            await self._see_halves()
            now = self._clock_ms()
            state = self._state
            changed = False
            for offset, half in sorted(state.halves.items()):
                if offset in state.kept or now - half.due_from_ms < self.options.check_interval_ms:
                    continue
                due = state.due.setdefault(half.group, set())
                if offset not in due and len(due) >= DUE_MAX_PER_GROUP:
                    continue
                checks = state.checks.get(offset, 0)
                if checks >= self.options.check_max:
                    await self._give_up(offset, half, checks)
                    changed = True
                    continue
                state.checks[offset] = checks + 1
                self.checks += 1
                half.due_from_ms = now
                due.add(offset)
                changed = True
            if changed:
                await self._save_checks()

    async def _give_up(self, offset: int, half: HalfInfo, checks: int) -> None:
        if self.options.keep_after_max:
            self._state.keep(offset)
            log.warning(
                "half message at queue offset %d (group %s) unresolved after %d checks: kept, "
                "no longer checked (--transaction-keep-after-max)",
                offset,
                quote(half.group),
                checks,
            )
            return
        record = await self._io.read_record(half.physical_offset, half.size)
        if record is None:
            return
        response = await self._io.append(op_record(record, offset, RESOLUTION_DISCARD), 1)
        self._state.own_op_written(response.queue_offsets[-1])
        self.resolved[RESOLUTION_DISCARD] += 1
        await self._resolved(offset, RESOLUTION_DISCARD, save=False)
        log.warning(
            "half message at queue offset %d (group %s, transaction %s) unresolved after %d "
            "checks: discarded",
            offset,
            quote(half.group),
            quote(record.properties.get(TRANSACTION_ID, "")),
            checks,
        )

"""``tide.v1.Dispatch`` over the DispatchStore: request checks, status codes, lookups.

Handlers run on the asyncio loop and only read the store (consume queue and index reads
are mmap reads, safe beside the writer thread); the writer is the dispatcher's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import grpc

from services.dispatch import lookup
from services.dispatch.answer_frames import Parts, entries_parts, notice_frame
from services.dispatch.arrivals import ArrivalHub
from services.dispatch.cold_entries import page_in
from services.dispatch.delivery.schedule import ScheduleService
from services.dispatch.delivery.timer import TimerService
from services.dispatch.dispatcher import Dispatcher
from services.dispatch.engine.consume_queue import ConsumeQueue, Entry
from services.dispatch.engine.dispatch_store import Arrival, DispatchStore
from services.dispatch.engine.index_service import MAX_QUERY_COUNT, MAX_QUERY_KEY_CHARS
from services.dispatch.pop.handles import PopHandles
from services.dispatch.pop.revive import Reviver
from services.dispatch.pop.service import PopService
from services.dispatch.storage_client import StorageClient
from services.dispatch.transaction.service import TransactionService
from tide.format import UNLIMITED_BYTES, select_spans
from tide.limits import (
    ACK_ENTRIES_MAX_COUNT,
    EXPRESSION_MAX_TAGS,
    POP_INVISIBLE_MAX_MS,
    PULL_MAX_MESSAGES,
    QUEUE_NUMS_MAX,
    WATCH_MAX_TOPICS,
)
from tide.mapped import read_through_file
from tide.naming import TAG_MAX_CHARS, consumer_group_error, topic_error
from tide.quoting import quote
from tide.server import MAX_MESSAGE_BYTES, ColdReads, ServiceError, StreamSlots
from tide.server._framed import framed_answer
from tide.server._request_streams import RequestStreams
from tide.v1 import dispatch_pb2 as pb
from tide.v1 import dispatch_pb2_grpc as pb_grpc
from tide.v1 import storage_pb2 as storage_pb

MAX_GET_ENTRIES = PULL_MAX_MESSAGES  # what one Pull asks for at most
# Record bytes one answer (GetQueueEntries with records, an arrival notice) carries at
# most, whatever max_bytes asks (0 included): the tail cache may hold far more than a
# gRPC message (64 MiB) takes, and the answer is built in memory. Half of it, as the
# storage's Read answers, leaves room for the entries and spans beside the records.
MAX_RECORDS_ANSWER_BYTES = MAX_MESSAGE_BYTES // 2
# With a tag filter, at least this many entries are looked at in one call (RocketMQ's
# getMessage looks at max(16000 bytes, maxMsgNums) of consume queue: 800 entries).
MIN_FILTER_SCAN_ENTRIES = 800
MAX_WATCH_TOPICS = WATCH_MAX_TOPICS
# Open WatchArrivals streams (a gateway opens one per dispatch): each holds one pending
# max offset per queue and one notice (at most MAX_RECORDS_ANSWER_BYTES) at a time.
MAX_WATCH_STREAMS = 1024
MAX_QUEUE_ID = 2**31 - 1
# QueryIndex asks the index for this many times max_count candidates, so that a few hash
# collisions do not crowd out real hits.
QUERY_OVERFETCH = 2
READER_THREADS = 4
# GetStatus asks the storage for its offsets, waiting at most this long.
STATUS_STORAGE_TIMEOUT_S = 1.0
_I64_MAX = 2**63 - 1
_NO_CODES: frozenset[int] = frozenset()
# GetQueueEntriesStream's answer, framed by hand around the parts of its response.
_ENTRIES_ANSWER = framed_answer(pb.GetQueueEntriesStreamResponse)
# Queues whose waiting reader is remembered (deleted topics' queues stay until then);
# forgotten all at once past it (their next notices carry no entries, once).
MAX_CAUGHT_UP_QUEUES = 100_000
# How long a records reader that read a queue to its end counts as keeping up: the
# queue's notices carry their entries meanwhile. A gateway that answers its held pulls
# from them reads again only when a notice comes without them or a long poll times out,
# so a consumer that keeps up costs a GetQueueEntries exchange now and then, not one an
# arrival. As long as a gateway's longest long poll by default (--max-long-poll-ms, 30 s):
# an idle consumer's held pull times out and reads before its mark runs out; a reader
# gone costs at most this long of notices carrying records nobody takes.
CAUGHT_UP_S = 30.0
MAX_POP_QUEUES = QUEUE_NUMS_MAX  # queues one PopMessages / GetPopLag names
MAX_HALVES_ANSWERED = 10_000  # half messages in one TakeTransactionChecks / ListHalfMessages
_T = TypeVar("_T")


@dataclass
class Running:
    """What the handlers need once the service has started."""

    store: DispatchStore
    storage: StorageClient
    dispatcher: Dispatcher
    schedule: ScheduleService | None = None  # the delay levels' delivery
    timer: TimerService | None = None  # the timed messages' delivery (--timer-enable)
    transactions: TransactionService | None = None  # half / op queues (issue 19)
    pop: PopService | None = None  # POP consumption (issue 20)
    pop_handles: PopHandles | None = None
    reviver: Reviver | None = None


def _delivery_status(running: Running) -> pb.DeliveryStatus:
    status = pb.DeliveryStatus()
    if running.schedule is not None:
        state = running.schedule.state()
        status.delay_levels_ms.extend(state.delay_levels_ms)
        status.delay_level_pending.extend(state.pending)
        status.active = state.active
    if running.timer is not None:
        # timer_max_delay_ms stays 0 without a timer: the gateway then refuses timed sends.
        timer = running.timer.status()
        status.MergeFrom(timer)
        # Each service follows the storage's role on its own: delivering if either is.
        status.active = status.active or timer.active
    return status


def _invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _check_queue_args(topic: str, queue_id: int) -> None:
    error = topic_error(topic)
    if error:
        raise _invalid(error)
    if not 0 <= queue_id <= MAX_QUEUE_ID:
        raise _invalid(f"queue_id must be >= 0 (got {queue_id})")


def _notice_entries_limits(request: pb.WatchArrivalsRequest) -> tuple[int, int]:
    """WatchArrivals' entries_max_count (0: notices carry no entries) and
    entries_max_bytes, checked."""
    count, max_bytes = request.entries_max_count, request.entries_max_bytes
    if not 0 <= count <= MAX_GET_ENTRIES:
        raise _invalid(
            f"entries_max_count must be in 0..{MAX_GET_ENTRIES}, 0 for notices without "
            f"entries (got {count})"
        )
    if max_bytes < 0:
        raise _invalid(f"entries_max_bytes must be >= 0, 0 for no limit (got {max_bytes})")
    return count, _records_bytes(max_bytes)


def _records_bytes(max_bytes: int) -> int:
    """The byte limit of an answer carrying records: ``max_bytes`` (0: no limit asked),
    at most MAX_RECORDS_ANSWER_BYTES."""
    return min(max_bytes or MAX_RECORDS_ANSWER_BYTES, MAX_RECORDS_ANSWER_BYTES)


def _storage_unavailable(storage: StorageClient, exc: grpc.aio.AioRpcError) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.UNAVAILABLE,
        f"reading from storage {storage.target} failed: {exc.code().name}: {exc.details()}",
    )


def _out_of_range(
    queue: ConsumeQueue, offset: int, min_offset: int, max_offset: int
) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.OUT_OF_RANGE,
        f"offset {offset} is outside consume queue {queue.name}'s range: "
        f"min_offset {min_offset}, max_offset {max_offset}",
    )


def _add_entries(
    response: pb.GetQueueEntriesResponse,
    looked_at: list[Entry],
    max_count: int,
    codes: frozenset[int],
    max_bytes: int,
) -> int:
    """Adds to ``response.entries`` the entries GetQueueEntries takes from ``looked_at``
    (the rules of :func:`tide.format.select_spans`, one QueueEntry
    each) and returns the next offset: past the last entry looked at, or the entry the
    byte limit stopped at."""
    add = response.entries.add
    limit = max_bytes or UNLIMITED_BYTES
    taken = total = 0
    next_offset = response.next_offset
    for entry in looked_at:
        if taken >= max_count:
            break
        next_offset = entry.queue_offset + 1
        if entry.is_pre_blank or (codes and entry.tags_code not in codes):
            continue
        total += entry.size
        if total > limit and taken:
            return entry.queue_offset
        add(
            queue_offset=entry.queue_offset,
            physical_offset=entry.commitlog_offset,
            size=entry.size,
            tags_code=entry.tags_code,
        )
        taken += 1
    return next_offset


def _scan_count(max_count: int, filtered: bool) -> int:
    """The entries a GetQueueEntries looks at for ``max_count``: with a tag filter at
    least MIN_FILTER_SCAN_ENTRIES (most may not match)."""
    return max(max_count, MIN_FILTER_SCAN_ENTRIES) if filtered else max_count


class DispatchServicer(pb_grpc.DispatchServicer):
    def __init__(self, running: Callable[[], Running], hub: ArrivalHub) -> None:
        self._running = running
        self._hub = hub
        self._watch_slots = StreamSlots("WatchArrivals", MAX_WATCH_STREAMS, "MAX_WATCH_STREAMS")
        # Lookups that can take long (QueryIndex's, SearchOffset's rounds) run here, off the
        # event loop; stop() waits for them before the store is closed (a call cancelled at
        # the end of the grace period leaves its thread running). Their reads of the key
        # index and the consume queues go through the files with pread, the GIL free while
        # the disk answers: entries spread over whole files are the least likely in memory.
        self._readers = ThreadPoolExecutor(
            READER_THREADS, thread_name_prefix="tide-dispatch-read", initializer=read_through_file
        )
        # Consume-queue entries far behind their queue's end and not in memory are brought
        # in on these threads before they are read on the loop (cold_entries.py): by
        # GetQueueEntries, POP receives, delay-level delivery and the transaction service
        # (one set of bounds for the dispatch).
        self.cold_reads = ColdReads()
        self._entries_streams = RequestStreams("queue entries", "calls")  # drain ends them
        # Queues where a records reader read to the end: (that offset, until when in
        # monotonic seconds). The arrival notices that start there or later carry their
        # entries until then.
        self._caught_up: dict[tuple[str, int], tuple[int, float]] = {}

    def drain(self) -> None:
        """End every WatchArrivals and GetQueueEntriesStream stream (the server is
        shutting down); a GetQueueEntriesStream once its request in hand is answered."""
        self._hub.close()
        self._entries_streams.drain()

    async def stop_readers(self) -> None:
        self.cold_reads.close()
        await asyncio.to_thread(self._readers.shutdown, wait=True)

    async def _in_reader(self, fn: Callable[..., _T], *args: object) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._readers, fn, *args)

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        _check_queue_args(topic, queue_id)
        queue = self._running().store.consume_queues.find(topic, queue_id)
        if queue is None:
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND,
                f"no consume queue {topic}/{queue_id}: nothing has been dispatched to it",
            )
        return queue

    # -- consume queues ------------------------------------------------------------
    async def GetQueueEntriesStream(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[pb.GetQueueEntriesRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[bytes]:
        """GetQueueEntries' requests over one stream, answered in order and in-band (the
        protocol is in dispatch.proto), each answer serialized here (the method's response
        serializer passes bytes through: service.py)."""
        async for response in self._entries_streams.serve(
            request_iterator, context, self._framed_entries, _ENTRIES_ANSWER
        ):
            yield response

    async def GetQueueEntries(
        self, request: pb.GetQueueEntriesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetQueueEntriesResponse:
        await self._page_in(request)
        response, records = self._entries(request)
        if records is not None:
            response.records = b"".join(records)
        return response

    async def _framed_entries(
        self, request: pb.GetQueueEntriesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> Parts:
        """GetQueueEntries' answer serialized, in parts (the stream's answer frames them,
        copying each once): the response without its records, then the ``records`` field
        written by hand around the tail cache's views (answer_frames; the bytes are
        protobuf's, tests/services/dispatch/test_entries_stream.py)."""
        await self._page_in(request)
        return entries_parts(*self._entries(request))

    async def _page_in(self, request: pb.GetQueueEntriesRequest) -> None:
        """The entries ``request`` will read, in memory before :meth:`_entries` reads them
        on the loop (cold_entries.page_in: far behind its queue's end and not in memory,
        read on a cold reader's thread). Nothing for a request :meth:`_entries` refuses
        (it says why)."""
        if not 1 <= request.max_count <= MAX_GET_ENTRIES:
            return
        queue = self._running().store.consume_queues.find(request.topic, request.queue_id)
        if queue is not None:
            scan = _scan_count(request.max_count, bool(request.tag_codes))
            await page_in(self.cold_reads, queue, request.offset, scan)

    def _entries(
        self, request: pb.GetQueueEntriesRequest
    ) -> tuple[pb.GetQueueEntriesResponse, list[memoryview] | None]:
        """The entries from the request's offset, or raises ServiceError (GetQueueEntries
        and its stream). Up to max_count entries, of the request's tag codes if any, and
        with max_bytes > 0 no more records' bytes than that (but at least one entry); with
        ``spans`` they come as runs of records adjacent in the commitlog (what a pull
        passes on to Storage/Read) instead of one QueueEntry each, and with ``records``
        also the spans' bytes when the tail cache holds all of them: answered apart, as
        views (the caller puts them in its answer), None otherwise."""
        max_count, max_bytes = request.max_count, request.max_bytes
        if not 1 <= max_count <= MAX_GET_ENTRIES:
            raise _invalid(f"max_count must be in 1..{MAX_GET_ENTRIES} (got {max_count})")
        if max_bytes < 0:
            raise _invalid(f"max_bytes must be >= 0, 0 for no limit (got {max_bytes})")
        if request.records:
            max_bytes = _records_bytes(max_bytes)
        queue = self._queue(request.topic, request.queue_id)
        max_offset = queue.max_offset  # max first: min never passes a max read before it
        min_offset = queue.min_offset
        offset = request.offset
        if not min_offset <= offset <= max_offset:
            raise _out_of_range(queue, offset, min_offset, max_offset)
        response = pb.GetQueueEntriesResponse(
            next_offset=offset, min_offset=min_offset, max_offset=max_offset
        )
        codes = frozenset(request.tag_codes)
        records = None
        if request.spans:  # the hot path of every pull: raw entries, selected in C
            records = self._add_spans(response, queue, max_count, codes, max_bytes, request.records)
            if request.records and not codes:
                self._note_caught_up(
                    request.topic, request.queue_id, response.next_offset, max_offset
                )
        elif offset < max_offset:
            scan = _scan_count(max_count, bool(codes))
            # Not past the max offset reported (the queue may grow meanwhile).
            looked_at = queue.get(offset, min(scan, max_offset - offset))
            response.next_offset = _add_entries(response, looked_at, max_count, codes, max_bytes)
        if response.next_offset == offset < max_offset and queue.min_offset > offset:
            # Nothing looked at below the max: retention moved the min past the offset
            # after the check above. Answer as a moment later (not "no entries" with a min
            # the queue no longer serves).
            raise _out_of_range(queue, offset, queue.min_offset, max_offset)
        return response, records

    def _note_caught_up(self, topic: str, queue_id: int, next_offset: int, max_offset: int) -> None:
        """Remember for CAUGHT_UP_S that a records reader of the queue read it to its end
        (its next read starts at ``next_offset``, the max: a gateway will hold its pull
        there until the next arrival's notice); forget it once one stops short of the
        end (it is reading behind: notices carry nothing it would use)."""
        key = (topic, queue_id)
        if next_offset == max_offset:
            if key not in self._caught_up and len(self._caught_up) >= MAX_CAUGHT_UP_QUEUES:
                self._caught_up.clear()
            self._caught_up[key] = (next_offset, time.monotonic() + CAUGHT_UP_S)
        elif key in self._caught_up:
            del self._caught_up[key]

    def _reader_waits(self, key: tuple[str, int], since: int) -> bool:
        """Whether a notice of ``key`` from ``since`` should carry its entries: a records
        reader read the queue to its end at ``since`` or before, within CAUGHT_UP_S."""
        caught_up = self._caught_up.get(key)
        return caught_up is not None and caught_up[0] <= since and time.monotonic() < caught_up[1]

    def _add_spans(
        self,
        response: pb.GetQueueEntriesResponse,
        queue: ConsumeQueue,
        max_count: int,
        codes: frozenset[int],
        max_bytes: int,
        records: bool,
        *,
        counted: bool = True,
    ) -> list[memoryview] | None:
        """Fill ``response`` (its offsets set, next_offset the request's offset, in the
        queue's range) with the spans from there and move next_offset past the entries
        looked at; with ``records``, answer the views of their records when the tail
        cache holds them all (the caller puts them in the answer), else None.
        ``counted``: in the tail cache's hits / misses (GetQueueEntries, not notices)."""
        offset = response.next_offset
        if offset == response.max_offset:
            return None
        scan = _scan_count(max_count, bool(codes))
        entries = queue.get_bytes(offset, min(scan, response.max_offset - offset))
        spans, next_offset = select_spans(entries, offset, max_count, codes, max_bytes, offset)
        add_span = response.spans.add
        for physical_offset, size, count in spans:
            add_span(physical_offset=physical_offset, size=size, count=count)
        response.next_offset = next_offset
        if not (records and spans):
            return None
        # The spans' records from the dispatcher's tail cache when it holds them all
        # (saves the gateway the Storage/Read hop for consumers that keep up).
        cache = self._running().dispatcher.tail_cache
        return cache.records(((at, size) for at, size, _ in spans), counted=counted)

    async def GetQueueOffsets(
        self, request: pb.GetQueueOffsetsRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetQueueOffsetsResponse:
        queue = self._queue(request.topic, request.queue_id)
        max_offset = queue.max_offset
        return pb.GetQueueOffsetsResponse(min_offset=queue.min_offset, max_offset=max_offset)

    async def SearchOffset(
        self, request: pb.SearchOffsetRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.SearchOffsetResponse:
        queue = self._queue(request.topic, request.queue_id)
        storage = self._running().storage
        try:
            offset = await lookup.search_offset(
                queue, request.timestamp_ms, storage.read, self._in_reader
            )
        except grpc.aio.AioRpcError as exc:
            raise _storage_unavailable(storage, exc) from exc
        except lookup.LookupFailedError as exc:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        return pb.SearchOffsetResponse(offset=offset)

    # -- the key index ---------------------------------------------------------------
    async def QueryIndex(
        self, request: pb.QueryIndexRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.QueryIndexResponse:
        topic, key, max_count = request.topic, request.key, request.max_count
        error = topic_error(topic)
        if error:
            raise _invalid(error)
        if not key or len(key) > MAX_QUERY_KEY_CHARS:
            raise _invalid(
                f"key must have 1..{MAX_QUERY_KEY_CHARS} characters (KEY_MAX_CHARS); got {len(key)}"
            )
        if not 1 <= max_count <= MAX_QUERY_COUNT:
            raise _invalid(f"max_count must be in 1..{MAX_QUERY_COUNT} (got {max_count})")
        begin_ms, end_ms = request.begin_ms, request.end_ms or _I64_MAX
        if begin_ms > end_ms:
            raise _invalid(f"begin_ms {begin_ms} is after end_ms {end_ms}")
        running = self._running()
        store = running.store
        wanted = min(MAX_QUERY_COUNT, max_count * QUERY_OVERFETCH)
        candidates = await self._in_reader(store.index.query, topic, key, wanted, begin_ms, end_ms)
        located = await self._in_reader(lookup.locate, store.consume_queues, topic, candidates)
        found = [item for item in located if item is not None]
        response = pb.QueryIndexResponse()
        for part in lookup.verify_batches(found):
            try:
                results = await running.storage.read(
                    [(item.entry.commitlog_offset, item.entry.size) for item in part]
                )
            except grpc.aio.AioRpcError as exc:
                raise _storage_unavailable(running.storage, exc) from exc
            for item, result in zip(part, results, strict=True):
                message = result.message
                if (
                    result.status != storage_pb.FOUND
                    or not lookup.key_matches(message, topic, key)
                    or not begin_ms <= message.store_timestamp_ms <= end_ms
                ):
                    continue
                response.hits.add(
                    physical_offset=item.entry.commitlog_offset,
                    size=item.entry.size,
                    queue_id=item.queue_id,
                    queue_offset=item.entry.queue_offset,
                    store_timestamp_ms=message.store_timestamp_ms,
                    msg_id=message.msg_id,
                )
                if len(response.hits) >= max_count:
                    return response
        return response

    # -- arrivals --------------------------------------------------------------------
    async def WatchArrivals(  # type: ignore[override]
        self, request: pb.WatchArrivalsRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[bytes]:
        """Arrival notices, each serialized here (the method's response serializer passes
        bytes through: service.py), a notice's entries framed around the tail cache's
        views (answer_frames)."""
        topics = list(request.topics)
        if len(topics) > MAX_WATCH_TOPICS:
            raise _invalid(f"{len(topics)} topics; at most {MAX_WATCH_TOPICS} per watch")
        for topic in topics:
            error = topic_error(topic)
            if error:
                raise _invalid(error)
        entries_max_count, entries_max_bytes = _notice_entries_limits(request)
        current: list[Arrival] = []
        if request.send_current:
            wanted = set(topics)
            current = [
                Arrival(queue.topic, queue.queue_id, queue.max_offset)
                for queue in self._running().store.consume_queues.queues()
                if not wanted or queue.topic in wanted
            ]
        announced: dict[tuple[str, int], int] = {}  # queue -> the max offset sent last
        with self._watch_slots.slot():
            async with contextlib.aclosing(self._hub.watch(topics, current)) as batches:
                async for batch in batches:
                    for key, max_offset in batch.items():
                        notice = pb.ArrivalNotice(
                            topic=key[0], queue_id=key[1], max_offset=max_offset
                        )
                        entries = None
                        if entries_max_count:
                            since = announced.get(key)
                            announced[key] = max_offset
                            if (
                                since is not None
                                and since < max_offset
                                and self._reader_waits(key, since)
                            ):
                                entries = self._notice_entries(
                                    notice, since, entries_max_count, entries_max_bytes
                                )
                        yield notice_frame(notice, entries)

    def _notice_entries(
        self, notice: pb.ArrivalNotice, since: int, max_count: int, max_bytes: int
    ) -> Parts | None:
        """The queue's entries from ``since`` with their records, as GetQueueEntries with
        spans and records answers them (serialized, in parts; ``notice.entries_offset``
        set to ``since``), when the tail cache holds every record (the watcher answers a
        pull held at ``since`` with them, without asking); else None. Only for a queue a
        records reader keeps up with (``_reader_waits``): one that reads behind would not
        use them."""
        queue = self._running().store.consume_queues.find(notice.topic, notice.queue_id)
        if queue is None:
            return None
        max_offset = queue.max_offset  # max first, as GetQueueEntries
        min_offset = queue.min_offset
        if not min_offset <= since < max_offset:  # retention passed it: nothing to carry
            return None
        entries = pb.GetQueueEntriesResponse(
            next_offset=since, min_offset=min_offset, max_offset=max_offset
        )
        records = self._add_spans(
            entries, queue, max_count, _NO_CODES, max_bytes, records=True, counted=False
        )
        if records is None:
            return None
        notice.entries_offset = since
        return entries_parts(entries, records)

    # -- status ----------------------------------------------------------------------
    async def GetStatus(
        self,
        request: pb.GetDispatchStatusRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.DispatchStatus:
        running = self._running()
        dispatcher = running.dispatcher
        try:
            live = await running.storage.status(STATUS_STORAGE_TIMEOUT_S)
            storage_min, storage_max = live.min_offset, live.max_offset
        except grpc.aio.AioRpcError:  # the last offsets seen
            last = running.storage.last_status
            storage_min = last.min_offset if last else 0
            storage_max = dispatcher.storage_max_seen or 0
        status = running.store.status()
        return pb.DispatchStatus(
            dispatched_offset=status.dispatched_offset,
            durable_offset=status.durable_offset,
            storage_max_offset=storage_max,
            storage_min_offset=storage_min,
            lag_bytes=max(0, storage_max - status.dispatched_offset),
            queue_count=status.queues,
            cq_segment_count=status.cq_segments,
            index_file_count=status.index_files,
            index_entry_count=status.index_entries,
            follower_state=dispatcher.follower_state,
            last_error=dispatcher.last_error,
            storage=running.storage.target,
            tail_reconnects=dispatcher.tail_reconnects,
            tail_restarts=dispatcher.restarts,
            delivery=_delivery_status(running),
        )

    # -- transactions (issue 19) -----------------------------------------------------
    def _transactions(self) -> TransactionService:
        service = self._running().transactions
        if service is None:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE, "this dispatch runs no transaction service yet"
            )
        return service

    async def EndTransaction(
        self,
        request: pb.DispatchEndTransactionRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.DispatchEndTransactionResponse:
        return await self._transactions().end(request)

    async def TakeTransactionChecks(
        self,
        request: pb.TakeTransactionChecksRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.TakeTransactionChecksResponse:
        count = _list_count(request.max_count)
        taken = await self._transactions().take_checks(request.producer_group, count)
        return pb.TakeTransactionChecksResponse(halves=taken)

    async def ListHalfMessages(
        self,
        request: pb.ListHalfMessagesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.ListHalfMessagesResponse:
        count = _list_count(request.max_count)
        listed = await self._transactions().list_halves(request.producer_group, count)
        return pb.ListHalfMessagesResponse(halves=listed)

    # -- pop (issue 20) ----------------------------------------------------------------
    def _pop(self) -> tuple[PopService, PopHandles, Reviver]:
        running = self._running()
        if running.pop is None or running.pop_handles is None or running.reviver is None:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "this dispatch runs no POP service yet")
        return running.pop, running.pop_handles, running.reviver

    async def PopMessages(
        self,
        request: pb.PopMessagesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.PopMessagesResponse:
        _check_pop_names(request.consumer_group, request.topic)
        if len(request.queue_ids) > MAX_POP_QUEUES or len(request.tags) > EXPRESSION_MAX_TAGS:
            raise _invalid(
                f"queue_ids names {len(request.queue_ids)} queues (at most {MAX_POP_QUEUES}) "
                f"and tags {len(request.tags)} tags (at most {EXPRESSION_MAX_TAGS})"
            )
        for tag in request.tags:
            if len(tag) > TAG_MAX_CHARS:
                raise _invalid(f"tag {quote(tag)} is over {TAG_MAX_CHARS} characters")
        return await self._pop()[0].pop(request)

    async def PopAck(
        self,
        request: pb.PopAckRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.PopAckResponse:
        _check_pop_names(request.consumer_group, request.topic)
        if len(request.entries) > ACK_ENTRIES_MAX_COUNT:
            raise _invalid(
                f"entries has {len(request.entries)} entries; at most {ACK_ENTRIES_MAX_COUNT} "
                "(ACK_ENTRIES_MAX_COUNT)"
            )
        return await self._pop()[1].ack(request)

    async def PopChangeInvisible(
        self,
        request: pb.PopChangeInvisibleRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.PopChangeInvisibleResponse:
        _check_pop_names(request.consumer_group, request.topic)
        if not 0 <= request.invisible_duration_ms <= POP_INVISIBLE_MAX_MS:
            raise _invalid(
                f"invisible_duration_ms must be in 0..{POP_INVISIBLE_MAX_MS} "
                f"(got {request.invisible_duration_ms})"
            )
        return await self._pop()[1].change_invisible(request)

    async def PopDeadLetter(
        self,
        request: pb.PopDeadLetterRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.PopDeadLetterResponse:
        _check_pop_names(request.consumer_group, request.topic)
        topic, msg_id = await self._pop()[2].dead_letter_now(request)
        return pb.PopDeadLetterResponse(topic=topic, msg_id=msg_id)

    async def GetPopLag(
        self,
        request: pb.GetPopLagRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pb.GetPopLagResponse:
        _check_pop_names(request.consumer_group, request.topic)
        if len(request.queue_ids) > MAX_POP_QUEUES:
            raise _invalid(
                f"queue_ids names {len(request.queue_ids)} queues; at most {MAX_POP_QUEUES}"
            )
        return await self._pop()[1].lag(request)


def _check_pop_names(group: str, topic: str) -> None:
    error = consumer_group_error(group) or topic_error(topic)
    if error:
        raise _invalid(error)


def _list_count(max_count: int) -> int:
    if not 0 <= max_count <= MAX_HALVES_ANSWERED:
        raise _invalid(f"max_count is {max_count}; give 1 to {MAX_HALVES_ANSWERED} (0: 1000)")
    return max_count or 1000

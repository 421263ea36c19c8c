"""Pull: consume queue entries from the broker's dispatch, bodies from its storage.

1. ``Dispatch.GetQueueEntries`` from the offset, prefiltered by the expression's tag hash
   codes, up to ``--max-pull-bytes`` of records (the dispatch stops before the entry that
   would pass it; at least one);
2. ``Storage.Read`` of those positions;
   both over long-lived streams to the member's dispatch and storage (read_streams.py),
   the unary calls in a sampled trace;
3. exact match of each message's real tags (two tags can share a hash code).

With ``encoding = ENCODING_RECORDS`` steps 1 and 2 ask for spans of adjacent records
instead, and the stored records are handed on undecoded (pull_records.py); a consumer
that keeps up gets them from the dispatch's tail cache in step 1, without step 2, and a
pull of ``*`` held until they arrived, or coming after an arrival notice carried them,
gets them from the gateway's copy of the notices' records, without step 1 either
(arrived.py, long_poll.py).

Statuses as RocketMQ's getMessage: FOUND; NO_NEW_MESSAGE (offset == max offset);
NO_MATCHED_MESSAGE (entries looked at, none matched; next_offset moves past them);
OFFSET_ILLEGAL (offset below min or above max; next_offset is the nearest valid one). A
queue nothing was ever dispatched to has min = max = 0. With nothing new and
``long_poll_timeout_ms`` > 0 the call is held (long_poll.py) and tried again on arrival.

The member read from is the broker's master, or its slave while the master is unreachable
(readers.py). An offset past the end of a slave's queue, or of a master whose dispatch is
still catching up with its storage (e.g. just restarted), is not OFFSET_ILLEGAL but
NO_NEW_MESSAGE at the same offset (RocketMQ's slave answers "retry" there too): the
consumer's position came from a member that was further on, and moving it back would
deliver messages twice.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from services.gateway.arrived import Answer, QueueKey
from services.gateway.brokers import BrokerChannels, BrokerUnreachable, broker_error
from services.gateway.consume_gate import ConsumeGate
from services.gateway.expression import ExpressionError, TagFilter, parse_expression
from services.gateway.long_poll import HeldPulls
from services.gateway.options import GatewayConfig
from services.gateway.pull_records import (
    SpanReadMismatch,
    cached_records,
    found_records,
    matching_records,
)
from services.gateway.queue_locks import QueueLocks
from services.gateway.readers import ReadMembers, is_slave
from services.gateway.routes import PERM_READ, Member, RouteCache, TopicView
from services.gateway.validate import check_group, check_queue, invalid
from tide.limits import PULL_MAX_MESSAGES
from tide.quoting import quote
from tide.server import ByteBudget, ServiceError
from tide.single_flight import SingleFlight
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

DEFAULT_MAX_MESSAGES = 32
MAX_MESSAGES = PULL_MAX_MESSAGES
Status = pb.PullResponse.Status
_ReadKey = tuple[Member, str, int, int, int, TagFilter, bool]
RECORDS = pb.PullRequest.ENCODING_RECORDS
Entries = dispatch_pb.GetQueueEntriesResponse
_ENCODINGS = frozenset(pb.PullRequest.Encoding.values())
_T = TypeVar("_T")
# DispatchStatus.follower_state of a dispatch that follows its storage live.
FOLLOWER_CONNECTED = "connected"


@dataclass(frozen=True, slots=True)
class QueueTarget:
    topic: str
    broker_name: str
    queue_id: int
    # The broker's live members, by broker id (0, the master, first when present).
    members: tuple[Member, ...]


async def read_queue(
    routes: RouteCache,
    members: ReadMembers,
    target: QueueTarget,
    call: Callable[[Member], Awaitable[_T]],
    *,
    require_read: bool = True,
) -> tuple[_T, Member]:
    """``call`` on the first reachable member of the target's broker (readers.py). When
    none could be reached, the route is fetched again once: it may predate a slave."""
    try:
        return await members.read(target.broker_name, target.members, call)
    except BrokerUnreachable:
        fresh = await readable_queue(
            routes,
            target.topic,
            target.broker_name,
            target.queue_id,
            refresh=True,
            require_read=require_read,
        )
        if fresh.members == target.members:
            raise
        return await members.read(fresh.broker_name, fresh.members, call)


async def readable_queue(
    routes: RouteCache,
    topic: str,
    broker_name: str,
    queue_id: int,
    *,
    refresh: bool = False,
    require_read: bool = True,
) -> QueueTarget:
    """The members to read (topic, broker, queue) from: NOT_FOUND for an unknown topic,
    broker or queue id, FAILED_PRECONDITION when the topic is not readable there (unless
    not ``require_read``: an operator's BrowseQueue of a write-only dead-letter queue)."""
    view = await routes.get(topic, refresh=refresh)
    data = view.queue_data.get(broker_name)
    if data is None or queue_id >= data.read_queue_nums or view.reader(broker_name) is None:
        view = await routes.get(topic, refresh=True)  # the cached route may be old
        data = view.queue_data.get(broker_name)
    if data is None:
        raise _unknown_broker(view, broker_name)
    if queue_id >= data.read_queue_nums:
        raise ServiceError(
            grpc.StatusCode.NOT_FOUND,
            f"queue_id {queue_id} is out of range: topic {quote(topic)} has {data.read_queue_nums} "
            f"read queues on broker {quote(broker_name)} (0..{data.read_queue_nums - 1})",
        )
    if require_read and not data.perm & PERM_READ:
        raise ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"topic {quote(topic)} is not readable on broker {quote(broker_name)} "
            f"(perm {data.perm}); update its perm to include read (4)",
        )
    member = view.reader(broker_name)
    if member is None:
        raise ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            f"broker {quote(broker_name)} has no live member (master or slave); "
            "retry when it is back",
        )
    if not member.dispatch:
        raise no_dispatch(member)
    members = view.members.get(broker_name, {})
    return QueueTarget(
        topic, broker_name, queue_id, tuple(members[broker_id] for broker_id in sorted(members))
    )


def no_dispatch(member: Member) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"broker {quote(member.broker_name)} ({member.storage}) registered no dispatch address: "
        "start its storage with --dispatch-address HOST:PORT of its dispatch service",
    )


def _unknown_broker(view: TopicView, broker_name: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.NOT_FOUND,
        f"broker {quote(broker_name)} does not serve topic {quote(view.topic)} "
        f"(it is on: {', '.join(sorted(view.queue_data)) or 'no broker'})",
    )


REFUSED_QUEUE_LOCKED = "queue_locked"
REFUSED_CONSUME_DISABLED = "consume_disabled"


class Puller:
    def __init__(
        self,
        config: GatewayConfig,
        routes: RouteCache,
        channels: BrokerChannels,
        held: HeldPulls,
        members: ReadMembers,
        queue_locks: QueueLocks | None = None,
    ) -> None:
        self._config = config
        # Orderly consumers' locks: a pull by a member that is not the holder is refused.
        self._queue_locks = queue_locks
        self._routes = routes
        self._channels = channels
        self._held = held
        self._members = members
        self._gate = ConsumeGate(channels, config.broker_timeout_s)
        self._inflight: SingleFlight[_ReadKey, pb.PullResponse] = SingleFlight("pull")
        # Each read counts --max-pull-bytes (what its answer may carry) while it runs: the
        # answers being built at once stay under max_pull_in_flight_bytes plus one pull's.
        self.budget = ByteBudget(
            "max_pull_in_flight_bytes",
            config.max_pull_in_flight_bytes,
            "Pull answers being read on this gateway",
        )

    def refused(self) -> dict[str, int]:
        """Pulls refused so far by reason (a metric): by the queue lock check (another
        member holds the queue) or because the group may not consume."""
        locks = self._queue_locks
        return {
            REFUSED_QUEUE_LOCKED: 0 if locks is None else locks.refused_pulls,
            REFUSED_CONSUME_DISABLED: self._gate.refused,
        }

    async def pull(self, request: pb.PullRequest, *, browse: bool = False) -> pb.PullResponse:
        """A Pull; with ``browse`` an operator's BrowseQueue: the queue's read permission
        is not required (dead-letter queues are write-only) and the call never waits
        (a long poll timeout is ignored). Neither commits anything."""
        if browse:
            request.long_poll_timeout_ms = 0
        if request.consumer_group:
            check_group(request.consumer_group)
        check_queue(request.topic, request.broker_name, request.queue_id)
        if request.offset < 0:
            raise invalid(f"offset must be >= 0 (got {request.offset})")
        max_messages = request.max_messages or DEFAULT_MAX_MESSAGES
        if not 1 <= max_messages <= MAX_MESSAGES:
            raise invalid(f"max_messages must be in 1..{MAX_MESSAGES} (got {max_messages})")
        timeout_ms = request.long_poll_timeout_ms
        if not 0 <= timeout_ms <= self._config.max_long_poll_ms:
            raise invalid(
                f"long_poll_timeout_ms must be in 0..{self._config.max_long_poll_ms} "
                f"(--max-long-poll-ms; got {timeout_ms})"
            )
        min_messages, fill_wait_ms = self._fill(request, max_messages)
        if browse:
            min_messages = 0
        try:
            tag_filter = parse_expression(request.expression)
        except ExpressionError as exc:
            raise invalid(f"expression: {exc}") from exc
        if request.encoding not in _ENCODINGS:
            raise invalid(
                f"encoding {request.encoding} is unknown: ENCODING_MESSAGES (0) or "
                "ENCODING_RECORDS (1)"
            )
        records = request.encoding == RECORDS
        target = await readable_queue(
            self._routes,
            request.topic,
            request.broker_name,
            request.queue_id,
            require_read=not browse,
        )
        await self._gate.check(request.consumer_group, target.broker_name, target.members)
        if self._queue_locks is not None and not browse:
            await self._queue_locks.check_pull(request)
        deadline = time.monotonic() + timeout_ms / 1000  # the min_messages wait counts too
        offset = request.offset
        # Records of every tag: what the arrival notices carried may be the answer.
        arrivals = records and tag_filter.matches_all
        fill_wait_s = fill_wait_ms / 1000 if min_messages > 1 else 0
        answer = await self._before_reading(
            target,
            offset,
            max_messages,
            (min_messages, fill_wait_s),
            arrivals,
            deadline if timeout_ms else None,
        )
        if answer is not None:
            return answer
        while True:
            since = self._held.sequence
            response, member = await read_queue(
                self._routes,
                self._members,
                target,
                lambda member: self._pull_shared(
                    member, target, offset, max_messages, tag_filter, records
                ),
                require_read=not browse,
            )
            if response.status != Status.NO_NEW_MESSAGE:
                return response
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return response
            # Held on the arrivals of the member that answered (a slave's own dispatch
            # while the master is down).
            key = (member.dispatch, target.topic, target.queue_id)
            if not await self._held.wait(key, offset, remaining_s, since):
                return response  # timed out (or the gateway is stopping)
            if arrivals:
                answer = self._answer_from(key, offset, max_messages)
                if answer is not None:
                    return answer

    async def _before_reading(
        self,
        target: QueueTarget,
        offset: int,
        max_messages: int,
        fill: tuple[int, float],
        arrivals: bool,
        deadline: float | None,
    ) -> pb.PullResponse | None:
        """What a pull does before it reads, on the arrivals of the member the read will
        ask first (readers.py): a ``fill`` (min_messages, wait) holds it until the notices
        say that many are there (only they are looked at: what follows gives the answer,
        whatever they said); with ``arrivals`` (records of every tag) the answer from the
        records the notices carried, or else, with a long poll (its ``deadline``) and no
        fill, a hold at the announced end. None: the pull reads."""
        min_messages, fill_wait_s = fill
        if not (fill_wait_s > 0 or arrivals):
            return None
        first = self._first_key(target)
        if first is None:
            return None
        if fill_wait_s > 0:
            await self._held.wait_filled(first, offset, min_messages, fill_wait_s)
        if not arrivals:
            return None
        answer = self._answer_from(first, offset, max_messages)
        if answer is None and deadline is not None and not fill_wait_s > 0:
            answer = await self._hold_at_end(first, offset, max_messages, deadline)
        return answer

    def _first_key(self, target: QueueTarget) -> QueueKey | None:
        """The arrivals key of the member a read would ask first (readers.py), if any."""
        order = self._members.order(target.members)
        member = order[0] if order else None
        if member is None or not member.dispatch:
            return None
        return (member.dispatch, target.topic, target.queue_id)

    def _answer_from(self, key: QueueKey, offset: int, max_messages: int) -> pb.PullResponse | None:
        """The answer from the records the arrival notices carried (arrived.py) when they
        hold the pull's offset, else None (the pull reads or waits as usual)."""
        found = self._held.arrived_answer(key, offset, max_messages, self._config.max_pull_bytes)
        return None if found is None else _arrived_response(found)

    async def _hold_at_end(
        self, key: QueueKey, offset: int, max_messages: int, deadline: float
    ) -> pb.PullResponse | None:
        """A records pull at the max offset the arrival notices announced (a consumer
        that keeps up) is held before asking the dispatch, which would answer that
        there is nothing new: the answer from the records of the notice that wakes it
        when it carries them (the dispatch sends them for a queue read to its end
        lately), else None and the pull reads as usual (woken without records, or at
        its timeout: then the read gives the answer)."""
        if not await self._held.hold_at_end(key, offset, deadline - time.monotonic()):
            return None
        return self._answer_from(key, offset, max_messages)

    def _fill(self, request: pb.PullRequest, max_messages: int) -> tuple[int, int]:
        """The pull's (min_messages, min_messages_wait_ms), checked."""
        min_messages, wait_ms = request.min_messages, request.min_messages_wait_ms
        if not 0 <= min_messages <= max_messages:
            raise invalid(
                f"min_messages must be in 0..max_messages ({max_messages}; got {min_messages}): "
                "a pull cannot wait for more messages than it takes"
            )
        if not 0 <= wait_ms <= self._config.max_long_poll_ms:
            raise invalid(
                f"min_messages_wait_ms must be in 0..{self._config.max_long_poll_ms} "
                f"(--max-long-poll-ms; got {wait_ms})"
            )
        return min_messages, wait_ms

    async def _pull_shared(
        self,
        member: Member,
        target: QueueTarget,
        offset: int,
        max_messages: int,
        tag_filter: TagFilter,
        records: bool,
    ) -> pb.PullResponse:
        """One read for every identical pull in flight at once (e.g. the many consumers of
        a queue woken by the same arrival): they share the answer (nobody changes it)."""
        key = (member, target.topic, target.queue_id, offset, max_messages, tag_filter, records)
        pull = self._pull_records if records else self._pull_once
        return await self._inflight.run(
            key,
            lambda: self._budgeted(lambda: pull(member, target, offset, max_messages, tag_filter)),
        )

    async def _budgeted(self, read: Callable[[], Awaitable[pb.PullResponse]]) -> pb.PullResponse:
        """``read()`` once the pull budget has room (backpressure: a pull waits, it is not
        refused), counting --max-pull-bytes against it until the answer is built."""
        reserve = self._config.max_pull_bytes
        budget = self.budget
        if budget.in_use_bytes >= budget.limit_bytes:
            await budget.wait_below()
        budget.force(reserve)
        try:
            return await read()
        finally:
            budget.give(reserve)

    async def _pull_once(
        self,
        member: Member,
        target: QueueTarget,
        offset: int,
        max_messages: int,
        tag_filter: TagFilter,
    ) -> pb.PullResponse:
        """A pull answered with decoded messages (ENCODING_MESSAGES)."""
        request = self._entries_request(target, offset, max_messages, tag_filter, spans=False)
        entries = await self._entries(member, target, request)
        if isinstance(entries, pb.PullResponse):
            return entries
        positions = [
            storage_pb.ReadRequest.Position(physical_offset=entry.physical_offset, size=entry.size)
            for entry in entries.entries
        ]
        read = await self._read(member, target, storage_pb.ReadRequest(positions=positions))
        response = _answer(
            Status.FOUND, entries.next_offset, entries.min_offset, entries.max_offset
        )
        found = storage_pb.FOUND
        if tag_filter.matches_all:  # one call: cheaper than appending one by one
            response.messages.extend([r.message for r in read.results if r.status == found])
        else:
            matches = tag_filter.matches
            response.messages.extend(
                [r.message for r in read.results if r.status == found and matches(r.message.tags)]
            )
        if not response.messages:
            response.status = Status.NO_MATCHED_MESSAGE
        return response

    async def _pull_records(
        self,
        member: Member,
        target: QueueTarget,
        offset: int,
        max_messages: int,
        tag_filter: TagFilter,
    ) -> pb.PullResponse:
        """A pull answered with the stored records (ENCODING_RECORDS, pull_records.py)."""
        request = self._entries_request(target, offset, max_messages, tag_filter, spans=True)
        entries = await self._entries(member, target, request)
        if isinstance(entries, pb.PullResponse):
            return entries
        if entries.records:  # the dispatch still held them: no storage read
            records, count = self._cached(entries, member, target)
        else:
            records, count = await self._read_spans(member, target, entries.spans)
        return _records_answer(entries, records, count, tag_filter)

    @staticmethod
    def _cached(entries: Entries, member: Member, target: QueueTarget) -> tuple[bytes, int]:
        """The records the dispatch answered GetQueueEntries with, beside its spans."""
        try:
            return cached_records(entries.spans, entries.records)
        except SpanReadMismatch as exc:
            raise ServiceError(
                grpc.StatusCode.INTERNAL, f"{_where('GetQueueEntries', member, target)}: {exc}"
            ) from exc

    def _entries_request(
        self,
        target: QueueTarget,
        offset: int,
        max_messages: int,
        tag_filter: TagFilter,
        *,
        spans: bool,
    ) -> dispatch_pb.GetQueueEntriesRequest:
        """The queue's entries from ``offset``, at most ``--max-pull-bytes`` of records
        (the dispatch stops before the entry that would pass it): one QueueEntry each, or
        with ``spans`` runs of adjacent records and their bytes when it still holds them."""
        return dispatch_pb.GetQueueEntriesRequest(
            topic=target.topic,
            queue_id=target.queue_id,
            offset=offset,
            max_count=max_messages,
            tag_codes=tag_filter.codes,
            max_bytes=self._config.max_pull_bytes,
            spans=spans,
            records=spans,
        )

    async def _read(
        self, member: Member, target: QueueTarget, request: storage_pb.ReadRequest
    ) -> storage_pb.ReadResponse:
        """Storage/Read on the member's storage (within its calls limit); a failed call
        is the pull's error, naming the storage."""
        try:
            async with self._channels.limit(member.storage):
                return await self._channels.read(
                    member.storage, request, self._config.broker_timeout_s
                )
        except grpc.aio.AioRpcError as exc:
            raise broker_error(exc, _where("Read", member, target, storage=True)) from exc

    async def _read_spans(
        self, member: Member, target: QueueTarget, spans: Sequence[storage_pb.RecordSpan]
    ) -> tuple[bytes, int]:
        """The spans' records from the member's storage (those it still has)."""
        read = await self._read(member, target, storage_pb.ReadRequest(spans=spans))
        try:
            return found_records(spans, read)
        except SpanReadMismatch as exc:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{_where('Read', member, target, storage=True)}: {exc}; "
                "the storage may predate span reads (upgrade it)",
            ) from exc

    async def _entries(
        self, member: Member, target: QueueTarget, request: dispatch_pb.GetQueueEntriesRequest
    ) -> dispatch_pb.GetQueueEntriesResponse | pb.PullResponse:
        """The queue's entries from ``request.offset``, or the pull's whole answer when
        there are none to read (nothing new, none matched, an offset out of range)."""
        if not member.dispatch:
            raise no_dispatch(member)
        offset = request.offset
        try:
            async with self._channels.limit(member.dispatch):
                entries = await self._channels.queue_entries(
                    member.dispatch, request, self._config.broker_timeout_s
                )
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code is grpc.StatusCode.NOT_FOUND:  # nothing dispatched to the queue yet
                return await self._out_of_range(member, target, offset, 0, 0)
            if code is grpc.StatusCode.OUT_OF_RANGE:
                low, high = await self._offsets(member, target)
                return await self._out_of_range(member, target, offset, low, high)
            raise broker_error(exc, _where("GetQueueEntries", member, target)) from exc
        if entries.entries or entries.spans:
            return entries
        low, high = entries.min_offset, entries.max_offset
        if entries.next_offset > offset:
            return _answer(Status.NO_MATCHED_MESSAGE, entries.next_offset, low, high)
        return _answer(Status.NO_NEW_MESSAGE, offset, low, high)

    async def _out_of_range(
        self, member: Member, target: QueueTarget, offset: int, low: int, high: int
    ) -> pb.PullResponse:
        """The answer for an offset outside the queue's entries on ``member``; past the end
        of a member that may be behind, the consumer waits (NO_NEW_MESSAGE) instead."""
        response = _by_range(offset, low, high)
        if offset > high and await self._may_be_behind(member, target):
            return _answer(Status.NO_NEW_MESSAGE, offset, low, high)
        return response

    async def _may_be_behind(self, member: Member, target: QueueTarget) -> bool:
        """A slave (its copy may lag the master's), or a dispatch not caught up with its
        storage."""
        if is_slave(member):
            return True
        try:
            async with self._channels.limit(member.dispatch):
                status: dispatch_pb.DispatchStatus = await self._channels.dispatch(
                    member.dispatch
                ).GetStatus(
                    dispatch_pb.GetDispatchStatusRequest(), timeout=self._config.broker_timeout_s
                )
        except grpc.aio.AioRpcError as exc:
            raise broker_error(exc, _where("GetStatus", member, target)) from exc
        return status.lag_bytes > 0 or status.follower_state != FOLLOWER_CONNECTED

    async def _offsets(self, member: Member, target: QueueTarget) -> tuple[int, int]:
        request = dispatch_pb.GetQueueOffsetsRequest(topic=target.topic, queue_id=target.queue_id)
        try:
            async with self._channels.limit(member.dispatch):
                offsets: dispatch_pb.GetQueueOffsetsResponse = await self._channels.dispatch(
                    member.dispatch
                ).GetQueueOffsets(request, timeout=self._config.broker_timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return 0, 0
            raise broker_error(exc, _where("GetQueueOffsets", member, target)) from exc
        return offsets.min_offset, offsets.max_offset


def _where(call: str, member: Member, target: QueueTarget, *, storage: bool = False) -> str:
    address = member.storage if storage else member.dispatch
    role = "master" if member.broker_id == 0 else f"slave {member.broker_id}"
    return f"{call} on broker {target.broker_name} {role} ({address})"


def _records_answer(
    entries: Entries, records: bytes, count: int, tag_filter: TagFilter
) -> pb.PullResponse:
    """A records pull's answer: the entries' ``count`` records, those whose tags match."""
    if not tag_filter.matches_all:
        records, count = matching_records(records, count, tag_filter.matches)
    response = _answer(
        Status.FOUND if count else Status.NO_MATCHED_MESSAGE,
        entries.next_offset,
        entries.min_offset,
        entries.max_offset,
    )
    response.records = records
    response.record_count = count
    return response


def _arrived_response(found: Answer) -> pb.PullResponse:
    response = _answer(Status.FOUND, found.next_offset, found.min_offset, found.max_offset)
    response.records = found.records
    response.record_count = found.count
    return response


def _answer(status: Status.ValueType, next_offset: int, low: int, high: int) -> pb.PullResponse:
    return pb.PullResponse(status=status, next_offset=next_offset, min_offset=low, max_offset=high)


def _by_range(offset: int, low: int, high: int) -> pb.PullResponse:
    """The answer for an offset judged against the queue's range alone."""
    if offset < low:
        return _answer(Status.OFFSET_ILLEGAL, low, low, high)
    if offset > high:
        return _answer(Status.OFFSET_ILLEGAL, high, low, high)
    if offset == high:
        return _answer(Status.NO_NEW_MESSAGE, offset, low, high)
    # Within the range after all (the queue moved between the two calls): try again.
    return _answer(Status.NO_MATCHED_MESSAGE, offset, low, high)

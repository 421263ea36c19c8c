"""Produce: validate each message, pick its queue, one Append per broker, retry elsewhere.

Every message is checked before anything is sent (one bad message rejects the call with
INVALID_ARGUMENT naming ``messages[i]``). Each message gets a queue (its explicit queue,
its sharding key's queue, or the topic's next round robin queue: the request's messages
for a topic go to one queue, as a RocketMQ batch send does); the messages for one
broker are encoded as commitlog records (``tide.format.RunWriter``) and go in one
``Storage.Append``, the brokers are called concurrently. When a broker cannot be reached
(UNAVAILABLE, DEADLINE_EXCEEDED) its messages, except those sent to an explicit queue,
are sent again to another broker, up to ``--produce-retries`` times.

The common request (one topic, no explicit queue or sharding key) takes a shorter path
(:class:`PlainBatch`): one queue for the whole batch, its records encoded in one run;
what it could not write goes the general way for its retries. So does a batch of one
topic whose sharding keys all hash to one queue (FIFO produce of one message group, or
of groups sharing a queue), and one whose keys hash to several queues (FIFO produce of
many groups): split by queue in one compiled call, each broker's queues in one run, the
brokers concurrently (``_send_spread``).

Outcome: every message written -> their results; none written -> the call fails with the
first failure's status; some written -> the others are SEND_FAILED with their error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc

from services.gateway.append_queue import Outcome
from services.gateway.bodies_only import messages_bytes
from services.gateway.brokers import UNREACHABLE, BrokerChannels, broker_error
from services.gateway.fault import LatencyFaultTolerance
from services.gateway.message_types import check_message_types, check_produce_topics
from services.gateway.options import GatewayConfig
from services.gateway.produce_idempotent import bare_idempotent, produce_idempotent
from services.gateway.produce_plain import PlainBatch, PlainGroup, bodies_wire, broker_runs
from services.gateway.produce_results import (
    Written,
    appended_response,
    produce_response,
    runs_response,
    written_rows,
)
from services.gateway.produce_routes import explicit_queue, no_writable_queue
from services.gateway.produce_timed import encode_timed, timed_deliveries, within_bounds
from services.gateway.records import BornHosts, add_message, append_request
from services.gateway.routes import Member, QueueRef, RouteCache, TopicView
from services.gateway.scheduled import (
    DeliveryBounds,
    DeliveryBoundsCache,
    broker_delay_error,
    is_delayed,
    scheduled_record,
)
from services.gateway.selection import QueueSelector, by_sharding_key, sharding_parts
from services.gateway.transactions import add_half, set_transaction_ids
from services.gateway.uniq import UniqueKeyGenerator
from services.gateway.validate import ProduceCheck, check_produce_messages
from tide.format import (
    SHARDING_KEY,
    TIMER_TOPIC,
    RunWriter,
    TopicMessageType,
    topic_part,
)
from tide.limits import request_error
from tide.naming import topic_error
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb

log = logging.getLogger("tide.gateway.produce")

AutoCreate = Callable[[str], Awaitable[TopicView]]
MAX_CACHED_TOPICS = 100_000


@dataclass(slots=True)
class _Pending:
    index: int
    message: pb.ProduceMessage
    view: TopicView
    explicit: QueueRef | None
    sharding_key: str
    unique_key: str
    excluded: set[str] | None = None
    error: ServiceError | None = None
    written: Written | None = None
    # A delayed message: the delivery bounds of each broker it may go to, by dispatch.
    bounds: dict[str, DeliveryBounds] | None = None
    # To a FIFO topic: its sharding key is its message group, stored as __SHARDINGKEY
    # and never moved to another broker's queue (that would break the group's order).
    fifo: bool = False


@dataclass(slots=True)
class _Group:
    member: Member
    items: list[_Pending] = field(default_factory=list)
    queues: list[int] = field(default_factory=list)


class Producer:
    def __init__(
        self,
        config: GatewayConfig,
        routes: RouteCache,
        channels: BrokerChannels,
        fault: LatencyFaultTolerance,
        auto_create: AutoCreate | None,
    ) -> None:
        self._config = config
        self._routes = routes
        self._channels = channels
        self._fault = fault
        self._selector = QueueSelector(fault)
        self._unique_keys = UniqueKeyGenerator()
        self._auto_create = auto_create
        self._born_hosts = BornHosts()
        self._topic_parts: dict[str, tuple[int, bytes]] = {}
        self._delivery_bounds = DeliveryBoundsCache(channels)
        # Record bytes sent to storages and written (metrics).
        self.written_bytes = 0
        self.halves_stored = 0  # transactional messages stored as half messages (a metric)

    async def produce(
        self,
        request: pb.ProduceRequest,
        peer: str,
        request_bytes: int,
        wire: bytes | None = None,
        *,
        internal: bool = False,
    ) -> pb.ProduceResponse:
        """One Produce (or ProduceStream request) of ``request_bytes`` encoded (what the
        caller sized it at for its limits); ``wire``: the request serialized, when the
        caller has it (else serialized here if the bytes path wants it). ``internal``:
        the gateway's own writers (send-back, resends), which may write system topics
        and skip the type check."""
        error = request_error(request)  # ProduceStream's requests: the interceptor leaves them
        if error is not None:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, error)
        messages = request.messages
        count = len(messages)
        if count == 0:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT, "messages is empty: send at least one message"
            )
        limit = self._config.max_produce_messages
        if count > limit:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{count} messages in one Produce; the limit is {limit} "
                "(--max-produce-messages): split the batch",
            )
        if request.producer_id:  # idempotent: its own path (produce_idempotent.py)
            return await self._produce_idempotent(request, peer, request_bytes, internal)
        if messages[0].deliver_at_ms or messages[0].delay_ms:  # maybe a timed batch
            timed = await self._produce_timed(request, peer, request_bytes, internal)
            if timed is not None:
                return timed
        bodies = bodies_wire(request, self._config.max_message_body_bytes, wire)
        if bodies is not None:  # bodies only, of one valid topic: told from the bytes
            check = ProduceCheck({bodies[0]}, routed=False, bodies_only=True, typed=False)
        else:
            check = check_produce_messages(
                messages,
                self._config.max_message_body_bytes,
                messages_bytes(request, request_bytes),
            )
        respond = runs_response if request.compact_results else produce_response
        if check.transactional and request.compact_results:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "compact_results is not for transactional messages (EndTransaction needs "
                "each half's result): send them without it",
            )
        if not internal:
            check_produce_topics(messages, check.topics)
        views = await self._views(check.topics)
        check_message_types(
            messages,
            {topic: view.message_type for topic, view in views.items()},
            typed=check.typed,
            type_check=self._config.topic_message_type_check and not internal,
        )
        born_host = self._born_hosts.packed(peer)
        now_ms = time.time_ns() // 1_000_000
        unique_keys = (
            self._unique_keys.next_many(count)  # none has one of its own
            if check.bodies_only or check.keyed_bodies
            else self._fill_unique_keys(messages)
        )
        if not check.delayed and not check.transactional and len(views) == 1:
            plain = self._plain_batch(messages, unique_keys, views, check, request)
            if plain is not None and bodies is not None:
                plain.wire = bodies[1]
            if plain is not None:
                await self._send_plain(plain, born_host, now_ms)
                return await self._plain_response(plain, born_host, now_ms)
        pending = await self._pending(messages, unique_keys, views)
        if check.delayed:
            await self._check_delays(pending, now_ms)
        await self._send(pending, born_host, now_ms, self._config.produce_retries + 1)
        response = respond(
            unique_keys,
            [item.written if item.error is None else None for item in pending],
            [item.error for item in pending],
        )
        if check.transactional:
            set_transaction_ids(response, messages, unique_keys)
            self.halves_stored += sum(
                message.transactional and item.error is None
                for message, item in zip(messages, pending, strict=True)
            )
        return response

    def _plain_batch(
        self,
        messages: Sequence[pb.ProduceMessage],
        unique_keys: list[str],
        views: dict[str, TopicView],
        check: ProduceCheck,
        request: pb.ProduceRequest,
    ) -> PlainBatch | None:
        """The batch of one topic's messages for one queue, or split by their sharding
        keys' queues (the plain path), or None: the general path takes it."""
        (view,) = views.values()
        compact = request.compact_results
        if not check.routed:  # round robin (a FIFO topic refuses messages without a group)
            if view.message_type is TopicMessageType.FIFO:
                return None
            return PlainBatch(
                messages, unique_keys, view, bodies_only=check.bodies_only, compact=compact
            )
        parts = sharding_parts(messages, view.writable, keyed=check.keyed_bodies)
        if parts is None:  # an explicit queue, or a message without a key
            return None
        return PlainBatch(
            messages,
            unique_keys,
            view,
            bodies_only=check.keyed_bodies,
            compact=compact,
            queue=parts[0][0] if len(parts) == 1 else None,
            parts=parts if len(parts) > 1 else None,
        )

    async def _plain_response(
        self, plain: PlainBatch, born_host: bytes, now_ms: int, *, delayed: bool = False
    ) -> pb.ProduceResponse:
        """The answer for a batch sent by one append; what its broker did not take first
        goes again the general way (``delayed``: its messages are, so checked first)."""
        if plain.appended is not None:  # compact, and written by one append
            return appended_response(plain.unique_keys, plain.appended)
        # A FIFO topic's messages never move to another broker (the general path's rule):
        # their group's order would break.
        if plain.unsent and self._config.produce_retries and not plain.groups:
            messages, unique_keys = plain.messages, plain.unique_keys
            sharded = plain.sharded  # hashed again over the other brokers' queues
            pending = [
                _Pending(
                    index,
                    messages[index],
                    plain.view,
                    None,
                    messages[index].sharding_key if sharded else "",
                    unique_keys[index],
                    {broker_name},
                    plain.errors[index],
                )
                for index, broker_name in plain.unsent
            ]
            if delayed:
                await self._check_delays(pending, now_ms)
            await self._send(pending, born_host, now_ms, self._config.produce_retries)
            for item in pending:
                plain.rows[item.index] = item.written if item.error is None else None
                plain.errors[item.index] = item.error
        respond = runs_response if plain.compact else produce_response
        return respond(plain.unique_keys, plain.rows, plain.errors)

    async def _produce_timed(
        self, request: pb.ProduceRequest, peer: str, request_bytes: int, internal: bool
    ) -> pb.ProduceResponse | None:
        """A batch of timed messages of one topic with bodies only (produce_timed.py),
        sent as one run to the topic's next queue; None: not such a batch (nothing was
        sent), the general path takes it."""
        messages = request.messages
        topic = messages[0].topic
        now_ms = time.time_ns() // 1_000_000
        deliveries = timed_deliveries(
            messages,
            topic,
            messages_bytes(request, request_bytes),
            self._config.max_message_body_bytes,
            now_ms,
        )
        if deliveries is None or topic_error(topic) is not None:
            return None
        if not internal:
            check_produce_topics(messages, {topic})
        view = (await self._views({topic}))[topic]
        check_message_types(
            messages,
            {topic: view.message_type},
            typed=True,
            type_check=self._config.topic_message_type_check and not internal,
        )
        if view.message_type is TopicMessageType.FIFO or not view.writable:
            return None
        members = [
            member
            for name in sorted({queue.broker_name for queue in view.writable})
            if (member := view.master(name)) is not None
        ]
        bounds = await self._delivery_bounds.bounds_of(members)
        if not within_bounds(deliveries, list(bounds.values()), now_ms):
            return None
        queue = self._selector.round_robin(view.topic, view.writable)
        member = None if queue is None else view.master(queue.broker_name)
        if queue is None or member is None:
            return None
        unique_keys = self._unique_keys.next_many(len(messages))
        plain = PlainBatch(
            messages, unique_keys, view, bodies_only=False, compact=request.compact_results
        )
        group = PlainGroup(member, RunWriter(self._born_hosts.packed(peer)), queue.queue_id)
        encode_timed(
            group.writer,
            self._topic_part(TIMER_TOPIC),
            [message.body for message in messages],
            unique_keys,
            deliveries,
            (topic, queue.queue_id),
            bounds[member.dispatch].timer_precision_ms,
            now_ms,
        )
        await self._append_plain(plain, group)
        born_host = group.writer.born_host
        return await self._plain_response(plain, born_host, now_ms, delayed=True)

    async def _produce_idempotent(
        self, request: pb.ProduceRequest, peer: str, request_bytes: int, internal: bool
    ) -> pb.ProduceResponse:
        """An idempotent producer's batch: a bare one (topic, body, queue) is checked by
        sizes and encoded in one loop, any other message by message."""
        messages = request.messages
        max_body_bytes = self._config.max_message_body_bytes
        topic = messages[0].topic
        bare = topic_error(topic) is None and bare_idempotent(
            request, request_bytes, max_body_bytes
        )
        if bare:
            topics, typed = {topic}, False
        else:
            check = check_produce_messages(messages, max_body_bytes)
            topics, typed = check.topics, check.typed
            if len(topics) != 1:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "an idempotent batch goes to one queue: split the batch by topic",
                )
        if not internal:
            check_produce_topics(messages, topics)
        views = await self._views(topics)
        check_message_types(
            messages,
            {name: view.message_type for name, view in views.items()},
            typed=typed,
            type_check=self._config.topic_message_type_check and not internal,
        )
        return await produce_idempotent(
            request,
            self._routes,
            self._channels,
            views[topic],
            self._born_hosts.packed(peer),
            time.time_ns() // 1_000_000,
            self._config.broker_timeout_s,
            self._topic_part(topic) if bare else None,
        )

    def _fill_unique_keys(self, messages: Sequence[pb.ProduceMessage]) -> list[str]:
        """Each message's unique key: its own, or a fresh one (one clock reading)."""
        given = [message.unique_key for message in messages]
        fresh = given.count("")
        if fresh == len(given):
            return self._unique_keys.next_many(fresh)
        if fresh:
            generated = iter(self._unique_keys.next_many(fresh))
            return [key or next(generated) for key in given]
        return given

    async def _pending(
        self,
        messages: Sequence[pb.ProduceMessage],
        unique_keys: list[str],
        views: dict[str, TopicView],
    ) -> list[_Pending]:
        pending: list[_Pending] = []
        for index, message in enumerate(messages):
            view = views[message.topic]
            route = message.WhichOneof("route")
            explicit: QueueRef | None = None
            if route == "queue":
                view, explicit = await explicit_queue(self._routes, index, message, view)
            elif not view.writable:
                raise no_writable_queue(view)
            sharding_key = message.sharding_key if route == "sharding_key" else ""
            fifo = view.message_type is TopicMessageType.FIFO
            if fifo and not sharding_key and explicit is None:
                sharding_key = message.properties.get(SHARDING_KEY, "")  # a group property
            pending.append(
                _Pending(
                    index, message, view, explicit, sharding_key, unique_keys[index], fifo=fifo
                )
            )
        return pending

    async def _check_delays(self, pending: list[_Pending], now_ms: int) -> None:
        """Check each delayed message against every broker it may be sent to (their
        dispatches' bounds, scheduled.py) before anything is sent; keep the bounds for
        the rewrite."""
        delayed = [item for item in pending if is_delayed(item.message)]
        members = {
            item.index: [
                member
                for name in sorted(self._brokers_of(item))
                if (member := item.view.master(name)) is not None
            ]
            for item in delayed
        }
        bounds = await self._delivery_bounds.bounds_of(
            member for found in members.values() for member in found
        )
        for item in delayed:
            for member in members[item.index]:
                error = broker_delay_error(
                    f"messages[{item.index}]", item.message, bounds[member.dispatch], now_ms
                )
                if error is not None:
                    raise error
            item.bounds = bounds

    @staticmethod
    def _brokers_of(item: _Pending) -> set[str]:
        if item.explicit is not None:
            return {item.explicit.broker_name}
        return {queue.broker_name for queue in item.view.writable}

    async def _views(self, topics: set[str]) -> dict[str, TopicView]:
        views: dict[str, TopicView] = {}
        for topic in sorted(topics):
            try:
                views[topic] = await self._routes.get(topic)
            except ServiceError as exc:
                if exc.code is not grpc.StatusCode.NOT_FOUND or self._auto_create is None:
                    raise
                log.info("creating topic %s on first produce (--auto-create-topics)", topic)
                views[topic] = await self._auto_create(topic)
        return views

    # -- the plain path ----------------------------------------------------------
    async def _send_plain(self, plain: PlainBatch, born_host: bytes, now_ms: int) -> None:
        """One attempt: the batch to the topic's next round robin queue, in one run."""
        view = plain.view
        if not view.writable:
            raise no_writable_queue(view)
        if plain.parts is not None:
            await self._send_spread(plain, plain.parts, born_host, now_ms)
            return
        queue = plain.queue or self._selector.round_robin(view.topic, view.writable)
        assert queue is not None  # nothing excluded, and the topic has writable queues
        count = len(plain.messages)
        member = view.master(queue.broker_name)
        if member is None:  # the route changed under us: the general way decides
            plain.failed(range(count), no_writable_queue(view), queue.broker_name)
            return
        group = PlainGroup(member, RunWriter(born_host), queue.queue_id)
        magic, part = self._topic_part(view.topic)
        plain.encode(group, magic, part, now_ms)
        await self._append_plain(plain, group)

    async def _send_spread(
        self,
        plain: PlainBatch,
        parts: list[tuple[QueueRef, list[int]]],
        born_host: bytes,
        now_ms: int,
    ) -> None:
        """One attempt: each queue's messages encoded in order, a broker's queues one after
        the other in one run, the brokers' Appends concurrently (as the general path's)."""
        magic, part = self._topic_part(plain.view.topic)
        sends = []
        for run in broker_runs(plain, parts, born_host, magic, part, now_ms):
            if run.group is None:  # the route changed under us: as _send_plain
                plain.failed(run.positions, no_writable_queue(plain.view), run.broker_name)
                continue
            sends.append(self._append_plain(plain, run.group, run.positions, run.queue_ids))
        await asyncio.gather(*sends)

    async def _append_plain(
        self,
        plain: PlainBatch,
        group: PlainGroup,
        positions: list[int] | None = None,
        queue_ids: list[int] | None = None,
    ) -> None:
        """Append the group's run: the whole batch's, or that of the messages at
        ``positions`` (to ``queue_ids``); their rows or errors into the batch."""
        data = group.writer.getvalue()
        indexes = range(len(plain.messages)) if positions is None else positions
        count = len(indexes)
        try:
            outcome = await self._call_append(group.member, data, count)
        except _AppendFailed as failed:
            unsent = group.member.broker_name if failed.unreachable else None
            plain.failed(indexes, failed.error, unsent)
            if failed.not_found:
                self._routes.invalidate(plain.view.topic)
            return
        self.written_bytes += len(data)
        name = group.member.broker_name
        if plain.compact and positions is None:  # the run is sliced from the Append's answer
            plain.appended = (name, group.queue_id, outcome.response, outcome.start)
            return
        queue_ids = queue_ids or [group.queue_id] * count
        plain.written(positions, written_rows(name, queue_ids, outcome.response, outcome.start))

    # -- the general path --------------------------------------------------------
    def _choose(self, item: _Pending) -> QueueRef | None:
        if item.explicit is not None:
            return item.explicit
        queues = item.view.writable
        excluded = item.excluded or ()
        if item.sharding_key:
            return by_sharding_key(queues, item.sharding_key, excluded)
        return self._selector.round_robin(item.view.topic, queues, excluded)

    def _choose_all(self, pending: list[_Pending]) -> list[QueueRef | None]:
        """Each item's queue: a topic's round robin items (no explicit queue, no sharding
        key, no broker excluded) all take the topic's next queue, as a RocketMQ batch send
        does."""
        chosen: list[QueueRef | None] = [None] * len(pending)
        round_robin: dict[int, list[int]] = {}  # id(view) -> positions
        for position, item in enumerate(pending):
            if item.explicit is None and not item.sharding_key and not item.excluded:
                round_robin.setdefault(id(item.view), []).append(position)
            else:
                chosen[position] = self._choose(item)
        for positions in round_robin.values():  # a topic's batch: one queue
            view = pending[positions[0]].view
            queue = self._selector.round_robin(view.topic, view.writable)
            for position in positions:
                chosen[position] = queue
        return chosen

    async def _send(
        self, pending: list[_Pending], born_host: bytes, now_ms: int, attempts: int
    ) -> None:
        """Up to ``attempts`` rounds: each round sends what is left to the brokers chosen
        then; items of a broker that could not be reached go again (not explicit ones)."""
        for attempt in range(attempts):
            groups: dict[tuple[str, str], _Group] = {}
            masters: dict[tuple[int, str], Member | None] = {}
            for item, queue in zip(pending, self._choose_all(pending), strict=True):
                member = None
                if queue is not None:
                    where = (id(item.view), queue.broker_name)
                    if where not in masters:
                        masters[where] = item.view.master(queue.broker_name)
                    member = masters[where]
                if queue is None or member is None:
                    item.error = item.error or no_writable_queue(item.view)
                    continue
                group = groups.get((member.broker_name, member.storage))
                if group is None:
                    group = groups[(member.broker_name, member.storage)] = _Group(member)
                group.items.append(item)
                group.queues.append(queue.queue_id)
            outcomes = await asyncio.gather(
                *(self._append(group, born_host, now_ms) for group in groups.values())
            )
            last = attempt == attempts - 1
            pending = [
                item
                for group, retry in zip(groups.values(), outcomes, strict=True)
                if retry
                for item in group.items
                if item.explicit is None and not item.fifo and not last
            ]
            if not pending:
                return

    async def _append(self, group: _Group, born_host: bytes, now_ms: int) -> bool:
        """One Append for the group; sets each item's result on success, its error on
        failure. True when the broker could not be reached (its items may be retried)."""
        member = group.member
        data = self._records(group, born_host, now_ms)
        try:
            outcome = await self._call_append(member, data, len(group.items))
        except _AppendFailed as failed:
            for item in group.items:
                item.error = failed.error
                if failed.unreachable:
                    if item.excluded is None:
                        item.excluded = set()
                    item.excluded.add(member.broker_name)
            if failed.not_found:
                for item in group.items:
                    self._routes.invalidate(item.view.topic)
            return failed.unreachable
        self.written_bytes += len(data)
        rows = written_rows(member.broker_name, group.queues, outcome.response, outcome.start)
        for item, row in zip(group.items, rows, strict=True):
            item.error = None
            item.written = row
        return False

    def _records(self, group: _Group, born_host: bytes, now_ms: int) -> bytes:
        """The group's messages as one record run."""
        writer = RunWriter(born_host)
        for item, queue_id in zip(group.items, group.queues, strict=True):
            if item.message.transactional:
                add_half(writer, item.message, queue_id, item.unique_key, now_ms)
                continue
            if item.bounds is None:
                group_key = item.sharding_key if item.fifo else ""
                add_message(writer, item.message, queue_id, item.unique_key, now_ms, group_key)
                continue
            # Stored in the schedule or timer topic of the real queue's broker (its
            # bounds were checked: _check_delays covered every broker of the topic).
            bounds = item.bounds[group.member.dispatch]
            message = item.message
            record = scheduled_record(message, queue_id, item.unique_key, bounds, now_ms)
            writer.add(
                record.topic,
                record.topic.encode("utf-8"),
                record.queue_id,
                message.body,
                record.properties,
                message.flag,
                0,
                message.born_timestamp_ms or now_ms,
            )
        return writer.getvalue()

    # -- both --------------------------------------------------------------------
    def _topic_part(self, topic: str) -> tuple[int, bytes]:
        part = self._topic_parts.get(topic)
        if part is None:
            part = topic_part(topic.encode("utf-8"))  # the name was checked (validate.py)
            if len(self._topic_parts) < MAX_CACHED_TOPICS:
                self._topic_parts[topic] = part
        return part

    async def _call_append(self, member: Member, run: bytes, count: int) -> Outcome:
        """Append the run of ``count`` records to the member; raises :class:`_AppendFailed`
        (the fault tolerance learns about the broker either way)."""
        request = append_request(run)
        started = time.monotonic()
        try:
            outcome = await self._channels.appends(member.storage).append(
                request, count, self._config.broker_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise self._failed(member, exc, (time.monotonic() - started) * 1000) from exc
        self._fault.update(member.broker_name, outcome.latency_ms)
        answered = len(outcome.response.physical_offsets)
        if answered < outcome.end or len(outcome.response.queue_offsets) < outcome.end:
            error = ServiceError(
                grpc.StatusCode.INTERNAL,
                f"broker {member.broker_name} answered {answered} offsets for "
                f"{outcome.end} records",
            )
            raise _AppendFailed(error, unreachable=False, not_found=False)
        return outcome

    def _failed(
        self, member: Member, exc: grpc.aio.AioRpcError, latency_ms: float
    ) -> _AppendFailed:
        code = exc.code()
        unreachable = code in UNREACHABLE
        if unreachable or code in (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.FAILED_PRECONDITION,
        ):
            self._fault.update(member.broker_name, latency_ms, isolation=True)
        error = broker_error(exc, f"Append to broker {member.broker_name} ({member.storage})")
        log.debug("%s", error.message)
        return _AppendFailed(
            error, unreachable=unreachable, not_found=code is grpc.StatusCode.NOT_FOUND
        )


class _AppendFailed(Exception):
    def __init__(self, error: ServiceError, *, unreachable: bool, not_found: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.unreachable = unreachable
        self.not_found = not_found

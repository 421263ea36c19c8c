"""Produce: validate each message, pick its queue, one Append per broker, retry elsewhere.

Every message is checked before anything is sent (one bad message rejects the call with
INVALID_ARGUMENT naming ``messages[i]``). Each message gets a queue (its explicit queue,
its sharding key's queue, or round robin over the writable queues); the messages for one
broker go in one ``Storage.Append``, the brokers are called concurrently. When a broker
cannot be reached (UNAVAILABLE, DEADLINE_EXCEEDED) its messages, except those sent to an
explicit queue, are sent again to another broker, up to ``--produce-retries`` times.

Outcome: every message written -> their results; none written -> the call fails with the
first failure's status; some written -> the others are SEND_FAILED with their error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from services.gateway.brokers import UNREACHABLE, BrokerChannels, broker_error
from services.gateway.fault import LatencyFaultTolerance
from services.gateway.options import GatewayConfig
from services.gateway.routes import PERM_WRITE, Member, QueueRef, RouteCache, TopicView
from services.gateway.selection import QueueSelector, by_sharding_key
from services.gateway.uniq import UniqueKeyGenerator
from services.gateway.validate import check_produce_messages, peer_host
from tide.format import UNIQ_KEY
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

log = logging.getLogger("tide.gateway.produce")


_STATUS: dict[storage_pb.AppendStatus.ValueType, pb.ProduceResult.Status.ValueType] = {
    storage_pb.PUT_OK: pb.ProduceResult.SEND_OK,
    storage_pb.FLUSH_DISK_TIMEOUT: pb.ProduceResult.FLUSH_DISK_TIMEOUT,
    storage_pb.FLUSH_SLAVE_TIMEOUT: pb.ProduceResult.FLUSH_SLAVE_TIMEOUT,
    storage_pb.SLAVE_NOT_AVAILABLE: pb.ProduceResult.SLAVE_NOT_AVAILABLE,
}
AutoCreate = Callable[[str], Awaitable[TopicView]]


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
    # (broker name, queue id, the broker's result) once written.
    written: tuple[str, int, storage_pb.AppendResult] | None = None


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

    async def produce(self, request: pb.ProduceRequest, peer: str) -> pb.ProduceResponse:
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
        check_produce_messages(messages, self._config.max_message_body_bytes)
        views = await self._views({message.topic for message in messages})
        born_host = peer_host(peer)
        now_ms = time.time_ns() // 1_000_000
        given = [message.unique_key for message in messages]
        fresh = iter(self._unique_keys.next_many(given.count("")))
        pending: list[_Pending] = []
        for index, message in enumerate(messages):
            view = views[message.topic]
            route = message.WhichOneof("route")
            explicit: QueueRef | None = None
            if route == "queue":
                view, explicit = await self._explicit_queue(index, message, view)
            elif not view.writable:
                raise _no_writable_queue(view)
            pending.append(
                _Pending(
                    index,
                    message,
                    view,
                    explicit,
                    message.sharding_key if route == "sharding_key" else "",
                    given[index] or next(fresh),
                )
            )
        await self._send(pending, born_host, now_ms)
        failed = [item for item in pending if item.error is not None]
        if len(failed) == count:
            first = failed[0].error
            assert first is not None
            raise first
        response = pb.ProduceResponse()
        add = response.results.add
        for item in pending:
            written = item.written
            if item.error is None and written is not None:
                broker_name, queue_id, result = written
                add(
                    status=_STATUS[result.status],
                    msg_id=result.msg_id,
                    unique_key=item.unique_key,
                    broker_name=broker_name,
                    queue_id=queue_id,
                    queue_offset=result.queue_offset,
                    store_timestamp_ms=result.store_timestamp_ms,
                )
            else:
                error = item.error
                assert error is not None
                add(
                    status=pb.ProduceResult.SEND_FAILED,
                    unique_key=item.unique_key,
                    error=f"{error.code.name}: {error.message}",
                )
        return response

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

    async def _explicit_queue(
        self, index: int, message: pb.ProduceMessage, view: TopicView
    ) -> tuple[TopicView, QueueRef]:
        ref = QueueRef(message.queue.broker_name, message.queue.queue_id)
        data = view.queue_data.get(ref.broker_name)
        if data is None or ref.queue_id >= data.write_queue_nums:
            view = await self._routes.get(message.topic, refresh=True)  # the cache may be old
            data = view.queue_data.get(ref.broker_name)
        where = f"messages[{index}].queue"
        if data is None:
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND,
                f"{where}: broker {ref.broker_name!r} does not serve topic {view.topic!r} "
                f"(it is on: {', '.join(sorted(view.queue_data)) or 'no broker'})",
            )
        if ref.queue_id >= data.write_queue_nums:
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND,
                f"{where}: queue_id {ref.queue_id} is out of range: topic {view.topic!r} has "
                f"{data.write_queue_nums} write queues on broker {ref.broker_name!r} "
                f"(0..{data.write_queue_nums - 1})",
            )
        if not data.perm & PERM_WRITE:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{where}: topic {view.topic!r} is not writable on broker {ref.broker_name!r} "
                f"(perm {data.perm}); update its perm to include write (2)",
            )
        if view.master(ref.broker_name) is None:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                f"{where}: broker {ref.broker_name!r} has no live master",
            )
        return view, ref

    def _choose(self, item: _Pending) -> QueueRef | None:
        if item.explicit is not None:
            return item.explicit
        queues = item.view.writable
        excluded = item.excluded or ()
        if item.sharding_key:
            return by_sharding_key(queues, item.sharding_key, excluded)
        return self._selector.round_robin(item.view.topic, queues, excluded)

    def _choose_all(self, pending: list[_Pending]) -> list[QueueRef | None]:
        """Each item's queue: round robin items (no explicit queue, no sharding key, no
        broker excluded) take their topic's next queues in one step."""
        chosen: list[QueueRef | None] = [None] * len(pending)
        round_robin: dict[int, list[int]] = {}  # id(view) -> positions
        for position, item in enumerate(pending):
            if item.explicit is None and not item.sharding_key and not item.excluded:
                positions = round_robin.get(id(item.view))
                if positions is None:
                    positions = round_robin[id(item.view)] = []
                positions.append(position)
            else:
                chosen[position] = self._choose(item)
        for positions in round_robin.values():
            view = pending[positions[0]].view
            queues = self._selector.round_robin_many(view.topic, view.writable, len(positions))
            for position, queue in zip(positions, queues, strict=False):
                chosen[position] = queue
        return chosen

    async def _send(self, pending: list[_Pending], born_host: str, now_ms: int) -> None:
        for attempt in range(self._config.produce_retries + 1):
            groups: dict[tuple[str, str], _Group] = {}
            masters: dict[tuple[int, str], Member | None] = {}
            for item, queue in zip(pending, self._choose_all(pending), strict=True):
                member = None
                if queue is not None:
                    where = (id(item.view), queue.broker_name)
                    if where in masters:
                        member = masters[where]
                    else:
                        member = masters[where] = item.view.master(queue.broker_name)
                if queue is None or member is None:
                    item.error = item.error or _no_writable_queue(item.view)
                    continue
                group = groups.get((member.broker_name, member.storage))
                if group is None:
                    group = groups[(member.broker_name, member.storage)] = _Group(member)
                group.items.append(item)
                group.queues.append(queue.queue_id)
            outcomes = await asyncio.gather(
                *(self._append(group, born_host, now_ms) for group in groups.values())
            )
            last = attempt == self._config.produce_retries
            pending = [
                item
                for group, retry in zip(groups.values(), outcomes, strict=True)
                if retry
                for item in group.items
                if item.explicit is None and not last
            ]
            if not pending:
                return

    async def _append(self, group: _Group, born_host: str, now_ms: int) -> bool:
        """One Append for the group; sets each item's result on success, its error on
        failure. True when the broker could not be reached (its items may be retried)."""
        member = group.member
        request = storage_pb.AppendRequest()
        add = request.messages.add  # in place: no per-message copy
        for item, queue_id in zip(group.items, group.queues, strict=True):
            message = item.message
            stored = add(
                topic=message.topic,
                queue_id=queue_id,
                body=message.body,
                born_timestamp_ms=message.born_timestamp_ms or now_ms,
                born_host=born_host,
            )
            if message.tags:
                stored.tags = message.tags
            if message.keys:
                stored.keys.extend(message.keys)
            if message.flag:
                stored.flag = message.flag
            properties = stored.properties
            if message.properties:
                properties.update(message.properties)
            properties[UNIQ_KEY] = item.unique_key
        started = time.monotonic()
        try:
            results, latency_ms = await self._channels.appends(member.storage).append(
                request.SerializeToString(), len(group.items), self._config.broker_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            latency_ms = (time.monotonic() - started) * 1000
            code = exc.code()
            unreachable = code in UNREACHABLE
            if unreachable or code in (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.FAILED_PRECONDITION,
            ):
                self._fault.update(member.broker_name, latency_ms, isolation=True)
            if code is grpc.StatusCode.NOT_FOUND:
                for item in group.items:
                    self._routes.invalidate(item.view.topic)
            error = broker_error(exc, f"Append to broker {member.broker_name} ({member.storage})")
            log.debug("%s (%d messages)", error.message, len(group.items))
            for item in group.items:
                item.error = error
                if unreachable:
                    if item.excluded is None:
                        item.excluded = set()
                    item.excluded.add(member.broker_name)
            return unreachable
        self._fault.update(member.broker_name, latency_ms)
        if len(results) != len(group.items):
            error = ServiceError(
                grpc.StatusCode.INTERNAL,
                f"broker {member.broker_name} answered {len(results)} results for "
                f"{len(group.items)} messages",
            )
            for item in group.items:
                item.error = error
            return False
        broker_name = member.broker_name
        for item, queue_id, result in zip(group.items, group.queues, results, strict=True):
            item.error = None
            item.written = (broker_name, queue_id, result)
        return False


def _no_writable_queue(view: TopicView) -> ServiceError:
    if not view.queue_data:
        return ServiceError(
            grpc.StatusCode.NOT_FOUND, f"topic {view.topic!r} has no queues on any live broker"
        )
    without_master = [name for name in sorted(view.queue_data) if view.master(name) is None]
    if len(without_master) == len(view.queue_data):
        return ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            f"no broker of topic {view.topic!r} has a live master "
            f"({', '.join(without_master)}); retry when a broker is back",
        )
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"topic {view.topic!r} has no writable queue on a reachable broker (perm without "
        "write (2), or the brokers failed); update its perm or retry",
    )

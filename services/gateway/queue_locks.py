"""Queue locks of orderly consumers (fifo, issue 19): forwarding and the pull check.

LockQueues / UnlockQueues go to the master storage of the named broker, which holds the
leases (services/storage/engine/queue_locks.py). GetQueueLocks merges the leases of
every master serving a topic.

"Only the holder gets messages from a locked queue": a Pull that carries a client id
from another member than the queue's holder is refused FAILED_PRECONDITION naming the
holder. Pulls without a client id are not checked (plain consumers, tools). The check
must not add an RPC per pull, so the gateway keeps each (broker, group, topic)'s lock
state for LOCK_STATE_TTL_MS (one GetQueueLocks per broker, group and topic per second at
most, whatever the pull rate: the pulls that find it stale share one fetch), and drops
it whenever a lock or unlock of that group and topic passes through it (the usual case:
a member locks through the gateway it pulls from, so its first pull sees its own lease).
A state at most LOCK_STATE_TTL_MS old can be wrong only around a hand-over: a new holder
locked through another gateway is refused for up to that long (its consumer retries the
pull), and a member that just released a queue could still pull it for that long — which
the consumer's own lock discipline already excludes (it released only after its last
commit). With the master unreachable the check is skipped: the leases are gone with it,
and orderly consumers stop on their own when their renewals fail.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import grpc

from services.gateway.brokers import BrokerChannels, broker_error
from services.gateway.options import GatewayConfig
from services.gateway.routes import Member, RouteCache
from services.gateway.validate import (
    check_broker_name,
    check_group,
    check_topic,
    invalid,
)
from tide.quoting import quote
from tide.server import ServiceError
from tide.single_flight import SingleFlight
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

# How long a broker's lock state of a (group, topic) is used for pull checks.
LOCK_STATE_TTL_MS = 1_000
# (broker, group, topic) lock states kept; the least recently fetched are dropped.
MAX_LOCK_STATES = 10_000

if TYPE_CHECKING:  # the async stub exists in the type stubs only
    from grpc.aio import UnaryUnaryMultiCallable

    from tide.v1.storage_pb2_grpc import StorageAsyncStub

_StateKey = tuple[str, str, str]  # broker, group, topic
_R = TypeVar("_R", storage_pb.QueueLockResponse, storage_pb.QueueUnlockResponse)


class QueueLocks:
    def __init__(self, config: GatewayConfig, routes: RouteCache, channels: BrokerChannels):
        self._config = config
        self._routes = routes
        self._channels = channels
        # (broker, group, topic) -> (fetched at, monotonic ms; queue id -> holder)
        self._states: OrderedDict[_StateKey, tuple[int, dict[int, str]]] = OrderedDict()
        self.refused_pulls = 0  # a metric (tide_gateway_pulls_refused_total)
        self._fetching: SingleFlight[_StateKey, dict[int, str] | None] = SingleFlight("queue-locks")

    # -- forwarding ------------------------------------------------------------------
    async def lock(self, request: pb.BrokerQueueLockRequest) -> storage_pb.QueueLockResponse:
        return await self._forward(request, "LockQueues", lambda stub: stub.LockQueues)

    async def unlock(self, request: pb.BrokerQueueLockRequest) -> storage_pb.QueueUnlockResponse:
        return await self._forward(request, "UnlockQueues", lambda stub: stub.UnlockQueues)

    async def _forward(
        self,
        request: pb.BrokerQueueLockRequest,
        what: str,
        rpc: Callable[[StorageAsyncStub], UnaryUnaryMultiCallable[storage_pb.QueueLockRequest, _R]],
    ) -> _R:
        """``request`` to its broker's master (``rpc`` of its storage stub); the cached
        lock state of its group and topics is dropped, answered or not."""
        member = await self._master_for(request)
        try:
            answer: _R = await rpc(self._channels.storage(member.storage))(
                request.request, timeout=self._config.broker_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise broker_error(exc, f"{what} on broker {member.broker_name}") from exc
        finally:
            self._forget(request)
        return answer

    async def locks(
        self, request: storage_pb.GetQueueLocksRequest
    ) -> storage_pb.GetQueueLocksResponse:
        check_group(request.consumer_group)
        check_topic(request.topic)
        view = await self._routes.get(request.topic)
        found: list[storage_pb.QueueLock] = []
        in_grace = False
        for broker_name in sorted(view.queue_data):
            member = view.master(broker_name)
            if member is None:
                continue
            answer = await self._fetch(member, request.consumer_group, request.topic)
            in_grace = in_grace or answer.in_grace
            for lock in answer.locks:
                lock.broker_name = broker_name
                found.append(lock)
        return storage_pb.GetQueueLocksResponse(locks=found, in_grace=in_grace)

    async def _master_for(self, request: pb.BrokerQueueLockRequest) -> Member:
        check_broker_name(request.broker_name)
        inner = request.request
        check_group(inner.consumer_group, "request.consumer_group")
        if not inner.client_id:
            raise invalid("request.client_id is empty: name the consumer group member")
        if not inner.queues:
            raise invalid("request.queues is empty: name the queues to lock or unlock")
        for index, queue in enumerate(inner.queues):
            check_topic(queue.topic, f"request.queues[{index}].topic")
        view = await self._routes.get(inner.queues[0].topic)
        member = view.master(request.broker_name)
        if member is None:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                f"broker {quote(request.broker_name)} has no live master for topic "
                f"{quote(view.topic)}: queue locks are held by the master; retry",
            )
        return member

    def _forget(self, request: pb.BrokerQueueLockRequest) -> None:
        group = request.request.consumer_group
        for topic in {queue.topic for queue in request.request.queues}:
            self._states.pop((request.broker_name, group, topic), None)

    async def _fetch(
        self, member: Member, group: str, topic: str
    ) -> storage_pb.GetQueueLocksResponse:
        try:
            answer: storage_pb.GetQueueLocksResponse = await self._channels.storage(
                member.storage
            ).GetQueueLocks(
                storage_pb.GetQueueLocksRequest(consumer_group=group, topic=topic),
                timeout=self._config.broker_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            raise broker_error(exc, f"GetQueueLocks on broker {member.broker_name}") from exc
        return answer

    # -- the pull check --------------------------------------------------------------
    async def check_pull(self, request: pb.PullRequest) -> None:
        """Refuse a pull by a member that does not hold the queue's lock (module doc).
        Called by the Puller once it checked the request's queue (and group, when set)."""
        client_id = request.client_id
        if not client_id:
            return
        check_group(request.consumer_group)  # a member's pull names its group
        holder = await self._holder(
            request.broker_name, request.consumer_group, request.topic, request.queue_id
        )
        if holder is not None and holder != client_id:
            self.refused_pulls += 1
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"queue {quote(request.topic)} {request.broker_name}/{request.queue_id} is "
                f"locked by {quote(holder)} of group {quote(request.consumer_group)}; "
                f"{quote(client_id)} may pull it after that member unlocks it or its lock "
                "expires (LockQueues)",
            )

    async def _holder(self, broker_name: str, group: str, topic: str, queue_id: int) -> str | None:
        holders = await self._holders((broker_name, group, topic))
        return None if holders is None else holders.get(queue_id)

    async def _holders(self, key: _StateKey) -> dict[int, str] | None:
        """Queue id -> holder of (broker, group, topic), at most LOCK_STATE_TTL_MS old;
        None without a reachable master (module doc). One fetch per key at a time
        (tide.single_flight): the pulls meanwhile wait for it."""
        state = self._states.get(key)
        if state is not None and _now_ms() - state[0] <= LOCK_STATE_TTL_MS:
            return state[1]
        return await self._fetching.run(key, lambda: self._fetch_holders(key))

    async def _fetch_holders(self, key: _StateKey) -> dict[int, str] | None:
        broker_name, group, topic = key
        fetched_ms = _now_ms()
        view = await self._routes.get(topic)
        member = view.master(broker_name)
        if member is None:
            return None  # module doc: no master, no leases
        try:
            answer = await self._fetch(member, group, topic)
        except ServiceError:
            return None  # unreachable master: as above
        holders = {lock.queue_id: lock.client_id for lock in answer.locks}
        self._states[key] = (fetched_ms, holders)
        self._states.move_to_end(key)
        if len(self._states) > MAX_LOCK_STATES:
            self._states.popitem(last=False)
        return holders


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000

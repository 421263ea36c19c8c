"""QueryMessage: by offset message id, by key, by unique key.

* msg id: the id holds the store host and the commitlog offset; the broker whose storage
  address is that host (cluster info) is asked for the record (``Storage.Read`` with size
  0: the record's own size).
* key / unique key: ``Dispatch.QueryIndex`` on every broker serving the topic (each hit is
  checked by the dispatch), then ``Storage.Read`` of the hits; newest first.

Each broker is read on its master, or on its slave while the master is unreachable
(readers.py). A message id names the master's storage (a slave's records carry the
master's store host): when that master is gone from the cluster info, the slaves of
brokers without a master are asked, and a record counts only when its own id is the one
asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc

from services.gateway.brokers import BrokerChannels, BrokerUnreachable, broker_error
from services.gateway.options import GatewayConfig
from services.gateway.pull import no_dispatch
from services.gateway.readers import ReadMembers
from services.gateway.routes import MASTER_ID, Member, RouteCache
from services.gateway.validate import check_topic, invalid
from tide.format import UNIQ_KEY, MessageIdError, parse_msg_id
from tide.limits import KEY_MAX_CHARS, limit_text
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import gateway_pb2 as pb
from tide.v1 import nameserver_pb2 as ns_pb
from tide.v1 import storage_pb2 as storage_pb

DEFAULT_KEY_RESULTS = 64
MAX_KEY_RESULTS = 1000
# A unique key normally names one message; a few when a producer retried.
UNIQUE_KEY_RESULTS = 32
# Masterless brokers whose slaves are asked for a message id whose master is gone.
MAX_ORPHAN_BROKERS = 16
# Record bytes a key query reads from one broker and answers in all: the newest messages
# that fit (at least one). 1,000 hits of 4 MiB messages would be 4 GiB held, past the
# storage's 64 MiB per Read and gRPC's 64 MiB per answer; half of that leaves room for
# the fields around the bodies. Older messages: narrow begin_ms / end_ms.
MAX_QUERY_ANSWER_BYTES = 32 << 20


class Querier:
    def __init__(
        self,
        config: GatewayConfig,
        routes: RouteCache,
        channels: BrokerChannels,
        members: ReadMembers,
    ) -> None:
        self._config = config
        self._routes = routes
        self._channels = channels
        self._members = members

    async def query(self, request: pb.QueryMessageRequest) -> pb.QueryMessageResponse:
        kind = request.WhichOneof("query")
        if kind == "msg_id":
            return await self._by_msg_id(request.msg_id)
        if kind == "key":
            return await self._by_key(request.key)
        if kind == "unique_key":
            return await self._by_unique_key(request.unique_key)
        raise invalid("give one of msg_id, key or unique_key")

    # -- by message id -------------------------------------------------------------
    async def _by_msg_id(self, msg_id: str) -> pb.QueryMessageResponse:
        try:
            host, offset = parse_msg_id(msg_id)
        except MessageIdError as exc:
            raise invalid(f"msg_id: {exc} (an offset message id as Produce returns it)") from exc
        address = str(host)
        # The cached cluster info first; a fresh one when it does not name the address or
        # its members cannot be reached (it may predate a slave, or a master's expiry).
        failure: BrokerUnreachable | None = None
        info = await self._routes.cluster_info()
        for refresh in (False, True):
            if refresh:
                info = await self._routes.cluster_info(refresh=True)
            broker_name, members = _members_at(info, address)
            if not members:
                continue
            try:
                message, member = await self._members.read(
                    broker_name, members, lambda member: self._read_at(member, offset, msg_id)
                )
            except BrokerUnreachable as exc:
                failure = exc
                continue
            return pb.QueryMessageResponse(
                messages=[pb.QueriedMessage(broker_name=member.broker_name, message=message)]
            )
        for member in _orphan_slaves(info):
            try:
                message = await self._read_at(member, offset, msg_id)
            except ServiceError as exc:
                if exc.code is grpc.StatusCode.NOT_FOUND or isinstance(exc, BrokerUnreachable):
                    continue
                raise
            if (message.store_host, message.physical_offset) == (address, offset):
                return pb.QueryMessageResponse(
                    messages=[pb.QueriedMessage(broker_name=member.broker_name, message=message)]
                )
        if failure is not None:
            raise failure
        raise ServiceError(
            grpc.StatusCode.NOT_FOUND,
            f"message {msg_id}: no live broker has the storage address {address} the id names"
            " (nor has a slave of a broker without a master the message)",
        )

    async def _read_at(self, member: Member, offset: int, msg_id: str) -> storage_pb.StoredMessage:
        stub = self._channels.storage(member.storage)
        where = f"broker {member.broker_name} ({member.storage})"
        timeout_s = self._config.broker_timeout_s
        missing = ServiceError(grpc.StatusCode.NOT_FOUND, f"message {msg_id} not found on {where}")
        try:
            read: storage_pb.ReadResponse = await stub.Read(
                storage_pb.ReadRequest(
                    positions=[storage_pb.ReadRequest.Position(physical_offset=offset, size=0)]
                ),
                timeout=timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INVALID_ARGUMENT):
                raise missing from exc
            raise broker_error(exc, f"reading message {msg_id} from {where}") from exc
        result = read.results[0]
        if result.status != storage_pb.FOUND:
            raise missing
        return result.message

    # -- by key --------------------------------------------------------------------
    async def _by_key(self, query: pb.KeyQuery) -> pb.QueryMessageResponse:
        check_topic(query.topic, "key.topic")
        _check_key(query.key, "key.key")
        max_count = query.max_count or DEFAULT_KEY_RESULTS
        if not 1 <= max_count <= MAX_KEY_RESULTS:
            raise invalid(f"key.max_count must be in 1..{MAX_KEY_RESULTS} (got {max_count})")
        if query.begin_ms < 0 or query.end_ms < 0:
            raise invalid("key.begin_ms and key.end_ms must be >= 0")
        if query.end_ms and query.begin_ms > query.end_ms:
            raise invalid(f"key.begin_ms {query.begin_ms} is after key.end_ms {query.end_ms}")
        found = await self._index(query.topic, query.key, max_count, query.begin_ms, query.end_ms)
        return _newest_first(found, max_count)

    async def _by_unique_key(self, query: pb.UniqueKeyQuery) -> pb.QueryMessageResponse:
        check_topic(query.topic, "unique_key.topic")
        _check_key(query.unique_key, "unique_key.unique_key")
        found = await self._index(query.topic, query.unique_key, UNIQUE_KEY_RESULTS, 0, 0)
        exact = [
            item for item in found if item.message.properties.get(UNIQ_KEY) == query.unique_key
        ]
        return _newest_first(exact, UNIQUE_KEY_RESULTS)

    async def _index(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> list[pb.QueriedMessage]:
        view = await self._routes.get(topic)
        brokers = {
            name: [by_id[broker_id] for broker_id in sorted(by_id)]
            for name in sorted(view.queue_data)
            if (by_id := view.members.get(name))
        }
        for listed in brokers.values():
            for member in listed:
                if not member.dispatch:
                    raise no_dispatch(member)
        if not brokers:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE, f"no broker of topic {quote(topic)} has a live member"
            )
        request = dispatch_pb.QueryIndexRequest(
            topic=topic, key=key, max_count=max_count, begin_ms=begin_ms, end_ms=end_ms
        )

        async def on_broker(name: str, members: list[Member]) -> list[pb.QueriedMessage]:
            try:
                found, _ = await self._members.read(
                    name, members, lambda member: self._index_on(member, request)
                )
            except BrokerUnreachable:
                # The cached route may predate a slave: once more with a fresh one.
                fresh = (await self._routes.get(topic, refresh=True)).members.get(name, {})
                if [fresh[i] for i in sorted(fresh)] == members:
                    raise
                found, _ = await self._members.read(
                    name,
                    [fresh[i] for i in sorted(fresh)],
                    lambda member: self._index_on(member, request),
                )
            return found

        answers = await asyncio.gather(
            *(on_broker(name, members) for name, members in brokers.items()),
            return_exceptions=True,
        )
        found: list[pb.QueriedMessage] = []
        failures: list[ServiceError] = []
        for answer in answers:
            if isinstance(answer, ServiceError):
                failures.append(answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                found.extend(answer)
        if failures and len(failures) == len(brokers):
            raise failures[0]
        return found

    async def _index_on(
        self, member: Member, request: dispatch_pb.QueryIndexRequest
    ) -> list[pb.QueriedMessage]:
        timeout_s = self._config.broker_timeout_s
        where = f"broker {member.broker_name}"
        try:
            hits: dispatch_pb.QueryIndexResponse = await self._channels.dispatch(
                member.dispatch
            ).QueryIndex(request, timeout=timeout_s)
            if not hits.hits:
                return []
            read: storage_pb.ReadResponse = await self._channels.storage(member.storage).Read(
                storage_pb.ReadRequest(
                    positions=[
                        storage_pb.ReadRequest.Position(
                            physical_offset=hit.physical_offset, size=hit.size
                        )
                        for hit in _newest_hits_that_fit(hits.hits)
                    ]
                ),
                timeout=timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            raise broker_error(exc, f"key lookup on {where}") from exc
        found = [result.message for result in read.results if result.status == storage_pb.FOUND]
        return [
            pb.QueriedMessage(broker_name=member.broker_name, message=message) for message in found
        ]


def _check_key(key: str, field: str) -> None:
    if not key:
        raise invalid(f"{field} is empty")
    if len(key) > KEY_MAX_CHARS:
        raise invalid(
            f"{field} is {len(key)} characters; the limit is {limit_text('KEY_MAX_CHARS')}"
        )


def _newest_first(found: list[pb.QueriedMessage], limit: int) -> pb.QueryMessageResponse:
    """The newest ``limit`` messages, as many as fit in MAX_QUERY_ANSWER_BYTES."""
    found.sort(
        key=lambda item: (item.message.store_timestamp_ms, item.message.physical_offset),
        reverse=True,
    )
    sizes = [item.ByteSize() for item in found[:limit]]
    return pb.QueryMessageResponse(messages=found[: _fitting(sizes)])


def _newest_hits_that_fit(hits: Sequence[dispatch_pb.IndexHit]) -> Sequence[dispatch_pb.IndexHit]:
    """The hits (newest first, as the dispatch answers) whose records fit in
    MAX_QUERY_ANSWER_BYTES (at least one)."""
    return hits[: _fitting([hit.size for hit in hits])]


def _fitting(sizes: Sequence[int]) -> int:
    """How many of ``sizes``, from the first, fit in MAX_QUERY_ANSWER_BYTES (at least one)."""
    total = 0
    for count, size in enumerate(sizes):
        total += size
        if total > MAX_QUERY_ANSWER_BYTES and count:
            return count
    return len(sizes)


def _member(live: ns_pb.BrokerLiveInfo) -> Member:
    return Member(live.broker_name, live.broker_id, live.address.storage, live.address.dispatch)


def _members_at(info: ns_pb.ClusterInfo, address: str) -> tuple[str, list[Member]]:
    """The broker one of whose members has the storage ``address``, and its live members."""
    name = next((live.broker_name for live in info.brokers if live.address.storage == address), "")
    return name, [_member(live) for live in info.brokers if name and live.broker_name == name]


def _orphan_slaves(info: ns_pb.ClusterInfo) -> list[Member]:
    """The lowest-id slave of every broker without a master in ``info`` (a bounded number)."""
    by_broker: dict[str, list[Member]] = {}
    for live in info.brokers:
        by_broker.setdefault(live.broker_name, []).append(_member(live))
    found = []
    for name in sorted(by_broker):
        members = sorted(by_broker[name], key=lambda member: member.broker_id)
        if members[0].broker_id != MASTER_ID:
            found.append(members[0])
    return found[:MAX_ORPHAN_BROKERS]

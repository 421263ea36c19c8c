"""Transactional messages at the gateway: half produce, EndTransaction, check streams.

* Produce of a message with ``transactional``: its record goes to
  ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 of its real queue's broker with the properties of
  ``tide.format.half_properties`` (TRAN_MSG=true marks it prepared; invisible: no
  consumer subscribes to a system topic). Its sys_flag transaction bits are NOT_TYPE, as
  RocketMQ's ``parseHalfMessageInner`` resets them: a record flagged PREPARED takes no
  queue offset (tide.format.is_queue_less) and would never reach the half queue. Its
  ProduceResult is the half's, plus the transaction id EndTransaction checks.
* EndTransaction goes to the dispatch of the broker's master (``Dispatch.EndTransaction``),
  which serializes the resolutions of its halves and writes the commit copy and op record
  (services/dispatch/transaction): the gateway keeps no state, any gateway may end any
  transaction.
* TransactionChecks: while a producer holds the stream of its group, this gateway asks
  every master's dispatch for the group's due halves every ``CHECK_POLL_S``
  (``Dispatch.TakeTransactionChecks``, which counts the check) and sends each on the
  stream; the producer answers with EndTransaction(from_check).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import grpc

from services.gateway.brokers import BrokerChannels, broker_error
from services.gateway.options import GatewayConfig
from services.gateway.records import message_properties
from services.gateway.routes import MASTER_ID, RouteCache
from services.gateway.validate import invalid
from tide.format import (
    HALF_QUEUE_ID,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TRANS_HALF_TOPIC,
    TRANSACTION_ID,
    UNIQ_KEY,
    MessageIdError,
    RunWriter,
    decode_properties,
    decode_record,
    encode_properties,
    half_properties,
    parse_msg_id,
)
from tide.naming import consumer_group_error
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import gateway_pb2 as pb
from tide.v1 import nameserver_pb2 as ns_pb

log = logging.getLogger("tide.gateway.transactions")

HALF_TOPIC_BYTES = TRANS_HALF_TOPIC.encode("utf-8")
CHECK_POLL_S = 1.0
"""How often a gateway with a check stream asks the brokers for due halves."""
CHECKS_PER_POLL = 64
"""Most halves taken from one broker per poll (the rest wait for the next poll)."""
DEFAULT_LIST_COUNT = 1000
MAX_LIST_COUNT = 10_000


def add_half(
    writer: RunWriter, message: pb.ProduceMessage, queue_id: int, unique_key: str, now_ms: int
) -> None:
    """The half record of a transactional message bound for ``queue_id`` of its topic."""
    properties = decode_properties(message_properties(message, unique_key))
    stored = half_properties(
        properties,
        message.topic,
        queue_id,
        message.producer_group,
        message.transaction_id or unique_key,
    )
    writer.add(
        TRANS_HALF_TOPIC,
        HALF_TOPIC_BYTES,
        HALF_QUEUE_ID,
        message.body,
        encode_properties(stored),
        message.flag,
        0,  # TRANSACTION_NOT_TYPE (see the module doc)
        message.born_timestamp_ms or now_ms,
    )


def set_transaction_ids(
    response: pb.ProduceResponse,
    messages: Sequence[pb.ProduceMessage],
    unique_keys: Sequence[str],
) -> None:
    for result, message, unique_key in zip(response.results, messages, unique_keys, strict=True):
        if message.transactional:
            result.transaction_id = message.transaction_id or unique_key


def _check_group(group: str, field: str) -> None:
    error = consumer_group_error(group)
    if error:
        raise invalid(f"{field}: {error}")


class Transactions:
    def __init__(self, config: GatewayConfig, routes: RouteCache, channels: BrokerChannels):
        self._config = config
        self._routes = routes
        self._channels = channels
        self.checks_sent = 0  # a metric: checks sent on producers' streams

    async def end(self, request: pb.EndTransactionRequest) -> pb.EndTransactionResponse:
        _check_group(request.producer_group, "producer_group")
        if request.resolution not in (pb.COMMIT, pb.ROLLBACK):
            raise invalid("resolution must be COMMIT or ROLLBACK")
        if not request.broker_name:
            raise invalid("broker_name is empty; give the half's ProduceResult.broker_name")
        if not request.transaction_id:
            raise invalid("transaction_id is empty; give the half's ProduceResult.transaction_id")
        physical_offset = 0
        if request.msg_id:
            try:
                _, physical_offset = parse_msg_id(request.msg_id)
            except MessageIdError as exc:
                raise invalid(f"msg_id {quote(request.msg_id)}: {exc}") from exc
        live = await self._master(request.broker_name)
        commit = request.resolution == pb.COMMIT
        try:
            ended: dispatch_pb.DispatchEndTransactionResponse = await self._channels.dispatch(
                live.address.dispatch
            ).EndTransaction(
                dispatch_pb.DispatchEndTransactionRequest(
                    producer_group=request.producer_group,
                    queue_offset=request.queue_offset,
                    physical_offset=physical_offset,
                    transaction_id=request.transaction_id,
                    commit=commit,
                    from_check=request.from_check,
                ),
                timeout=self._config.broker_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            raise broker_error(
                exc, f"ending the transaction on broker {request.broker_name}"
            ) from exc
        if not commit:
            return pb.EndTransactionResponse()
        return pb.EndTransactionResponse(
            committed=pb.ProduceResult(
                msg_id=ended.msg_id,
                unique_key=ended.unique_key,
                broker_name=request.broker_name,
                queue_id=ended.queue_id,
                queue_offset=ended.queue_offset,
                store_timestamp_ms=ended.store_timestamp_ms,
                transaction_id=request.transaction_id,
            )
        )

    async def checks(
        self, request: pb.TransactionChecksRequest
    ) -> AsyncIterator[pb.TransactionCheck]:
        """Check requests of the group until the producer closes the stream."""
        _check_group(request.producer_group, "producer_group")
        taking = dispatch_pb.TakeTransactionChecksRequest(
            producer_group=request.producer_group, max_count=CHECKS_PER_POLL
        )
        while True:
            for live in await self._masters():
                try:
                    taken: dispatch_pb.TakeTransactionChecksResponse = (
                        await self._channels.dispatch(live.address.dispatch).TakeTransactionChecks(
                            taking, timeout=self._config.broker_timeout_s
                        )
                    )
                except grpc.aio.AioRpcError as exc:
                    log.debug("broker %s: no checks taken (%s)", live.broker_name, exc.code().name)
                    continue
                for entry in taken.halves:
                    self.checks_sent += 1
                    yield pb.TransactionCheck(half=_half(live, entry))
            await asyncio.sleep(CHECK_POLL_S)

    async def list_halves(self, request: pb.ListTransactionsRequest) -> pb.ListTransactionsResponse:
        if request.producer_group:
            _check_group(request.producer_group, "producer_group")
        count = request.max_count or DEFAULT_LIST_COUNT
        if not 1 <= count <= MAX_LIST_COUNT:
            raise invalid(
                f"max_count is {request.max_count}; give 1 to {MAX_LIST_COUNT} "
                f"(0: {DEFAULT_LIST_COUNT})"
            )
        asking = dispatch_pb.ListHalfMessagesRequest(
            producer_group=request.producer_group, max_count=count
        )
        response = pb.ListTransactionsResponse()
        for live in await self._masters():
            try:
                listed: dispatch_pb.ListHalfMessagesResponse = await self._channels.dispatch(
                    live.address.dispatch
                ).ListHalfMessages(asking, timeout=self._config.broker_timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise broker_error(exc, f"listing the halves of broker {live.broker_name}") from exc
            response.halves.extend(_half(live, entry) for entry in listed.halves)
        return response

    async def _masters(self) -> list[ns_pb.BrokerLiveInfo]:
        info = await self._routes.cluster_info(refresh=False)
        return [live for live in info.brokers if live.broker_id == MASTER_ID]

    async def _master(self, broker_name: str) -> ns_pb.BrokerLiveInfo:
        for refresh in (False, True):
            info = await self._routes.cluster_info(refresh=refresh)
            for live in info.brokers:
                if live.broker_name == broker_name and live.broker_id == MASTER_ID:
                    return live
        raise ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            f"broker {quote(broker_name)} has no live master to end the transaction on; "
            "retry later",
        )


def _half(live: ns_pb.BrokerLiveInfo, entry: dispatch_pb.HalfEntry) -> pb.HalfMessage:
    record = decode_record(entry.record, 0, len(entry.record))
    props = record.properties
    real_qid = props.get(REAL_QID, "0")
    return pb.HalfMessage(
        broker_name=live.broker_name,
        msg_id=entry.msg_id,
        queue_offset=entry.queue_offset,
        transaction_id=props.get(TRANSACTION_ID, ""),
        producer_group=props.get(PGROUP, ""),
        topic=props.get(REAL_TOPIC, ""),
        queue_id=int(real_qid) if real_qid.isdigit() else 0,
        unique_key=props.get(UNIQ_KEY, ""),
        body=record.body,
        properties=props,
        store_timestamp_ms=record.store_timestamp_ms,
        checks=entry.checks,
    )

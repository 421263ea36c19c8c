"""RecallMessage: cancel a timed message before it is due (RocketMQ 5's recall).

The msg_id Produce returned names the stored timed copy (in ``rmq_sys_wheel_timer``). The
gateway reads it (QueryMessage's path), checks that it is a timed message whose slot has
not fired (the broker's ``DeliveryStatus.timer_delivered_to_ms``), and appends a delete
marker to the same broker's timer topic: ``TIMER_DEL_UNIQKEY = "<real topic>+<UNIQ_KEY>"``
with the message's ``TIMER_OUT_MS``. The timer files it as a DELETE unit in the same slot
and leaves the message out when the slot fires (docs/delivery.md, "Recall").

A recall that reaches the timer after the slot fired cancels nothing: the check here
narrows that race to the time between the status and the marker's filing (tens of ms).
"""

from __future__ import annotations

import grpc

from services.gateway.brokers import BrokerChannels, broker_error
from services.gateway.options import GatewayConfig
from services.gateway.query import Querier
from services.gateway.routes import MASTER_ID, RouteCache
from services.gateway.validate import invalid
from tide.format import (
    REAL_QID,
    REAL_TOPIC,
    TIMER_DEL_UNIQKEY,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
    TIMER_TOPIC,
    UNIQ_KEY,
    timer_delete_key,
)
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb


def _precondition(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, message)


def _timed_fields(msg_id: str, message: storage_pb.StoredMessage) -> tuple[int, int]:
    """(slot time, due time) of a stored timed message; FAILED_PRECONDITION otherwise."""
    props = message.properties
    out = props.get(TIMER_OUT_MS, "")
    if message.topic != TIMER_TOPIC or TIMER_DEL_UNIQKEY in props or not out.isdigit():
        raise _precondition(
            f"message {quote(msg_id)} is not a timed message (it is stored in topic "
            f"{quote(message.topic)}); only the msg_id Produce returned for a message with "
            "deliver_at_ms or delay_ms can be recalled"
        )
    deliver = props.get(TIMER_DELIVER_MS, "")
    return int(out), int(deliver) if deliver.isdigit() else int(out)


class Recaller:
    def __init__(
        self,
        config: GatewayConfig,
        routes: RouteCache,
        channels: BrokerChannels,
        querier: Querier,
    ) -> None:
        self._config = config
        self._routes = routes
        self._channels = channels
        self._querier = querier

    async def recall(self, request: pb.RecallMessageRequest) -> pb.RecallMessageResponse:
        if not request.msg_id:
            raise invalid("msg_id is empty; give the msg_id Produce returned")
        found = await self._querier.query(pb.QueryMessageRequest(msg_id=request.msg_id))
        queried = found.messages[0]
        message = queried.message
        slot_ms, deliver_ms = _timed_fields(request.msg_id, message)
        storage, dispatch = await self._master(queried.broker_name)
        timeout_s = self._config.broker_timeout_s
        try:
            status: dispatch_pb.DispatchStatus = await self._channels.dispatch(dispatch).GetStatus(
                dispatch_pb.GetDispatchStatusRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise broker_error(exc, f"asking broker {queried.broker_name}'s timer") from exc
        delivered_to = status.delivery.timer_delivered_to_ms
        if slot_ms < delivered_to:  # the slot fired: the message was delivered
            raise _precondition(
                f"message {quote(request.msg_id)} was due at {deliver_ms} ms and has been "
                f"delivered (the timer of broker {queried.broker_name} has delivered "
                f"everything due before {delivered_to} ms); it can no longer be recalled"
            )
        props = message.properties
        real_topic = props.get(REAL_TOPIC, "")
        uniq = props.get(UNIQ_KEY, "")
        marker = storage_pb.Message(
            topic=TIMER_TOPIC,
            queue_id=0,
            properties={
                REAL_TOPIC: real_topic,
                REAL_QID: props.get(REAL_QID, "0"),
                TIMER_OUT_MS: str(slot_ms),
                TIMER_DEL_UNIQKEY: timer_delete_key(real_topic, uniq),
            },
        )
        try:
            await self._channels.storage(storage).Append(
                storage_pb.AppendRequest(messages=[marker]), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            where = f"recording the recall on broker {queried.broker_name}"
            raise broker_error(exc, where) from exc
        return pb.RecallMessageResponse(unique_key=uniq, deliver_at_ms=deliver_ms)

    async def _master(self, broker_name: str) -> tuple[str, str]:
        """The storage and dispatch addresses of the broker's master (a recall is a write)."""
        for refresh in (False, True):
            info = await self._routes.cluster_info(refresh=refresh)
            for live in info.brokers:
                if live.broker_name == broker_name and live.broker_id == MASTER_ID:
                    return live.address.storage, live.address.dispatch
        raise ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            f"broker {broker_name} has no live master to record the recall on; retry later",
        )

"""POP consumption of the v2 API (ReceiveMessage, AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue) onto the gateway's PopConsumers (services/gateway/pop.py,
the tide.v1 Receive / Ack / ... calls), with the proxy's checks and codes:

* long polling: the request's timeout, else the call's time left less half the client's
  request timeout, clamped to 5 .. 20 s and to the call's deadline; under 5 s left:
  ILLEGAL_POLLING_TIME (never a call held past its deadline);
* invisible duration 10 s .. 12 h (ILLEGAL_INVISIBLE_TIME); none given with auto_renew
  (push consumers): AUTO_RENEW_INVISIBLE_MS (the gateway does not renew it: the client
  changes it or acks within that time);
* an empty receive: MESSAGE_NOT_FOUND and the delivery timestamp;
* receipt handle problems (PopError): INVALID_RECEIPT_HANDLE.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Protocol

from services.gateway.pop_errors import PopError
from services.gateway.v2.messages import duration_ms, to_duration, to_timestamp, v2_message
from services.gateway.v2.status import OK, V2Error, group_of, status, status_of, topic_of
from tide.limits import (
    ACK_ENTRIES_MAX_COUNT,
    POP_INVISIBLE_MAX_MS,
    POP_INVISIBLE_MIN_MS,
    RECEIPT_HANDLE_MAX_CHARS,
)
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.v1 import gateway_pb2 as pb

MIN_POLLING_MS = 5_000
MAX_POLLING_MS = 20_000
AUTO_RENEW_INVISIBLE_MS = 60_000
"""A push consumer's invisible duration (it asks the server to pick one)."""
RECEIVE_BATCH_MAX = 32
"""Most messages one ReceiveMessage asks for (the proxy's receive batch maximum)."""


class PopApi(Protocol):
    """What the gateway's PopConsumers offers both wire APIs (common contract)."""

    async def receive(
        self, request: pb.ReceiveRequest, *, deadline_ms: int | None
    ) -> pb.ReceiveResponse:
        """``deadline_ms``: the call's deadline, ms since the epoch (None: none)."""
        ...

    async def ack(self, request: pb.AckRequest) -> pb.AckResponse: ...

    async def change_invisible_duration(
        self, request: pb.ChangeInvisibleDurationRequest
    ) -> pb.ChangeInvisibleDurationResponse: ...

    async def forward_to_dead_letter(
        self, request: pb.ForwardToDeadLetterRequest
    ) -> pb.ForwardToDeadLetterResponse: ...


def polling_ms(request: v2s.ReceiveMessageRequest, remaining_ms: int | None) -> int:
    """How long to hold an empty receive (the proxy's rules, module doc)."""
    if request.HasField("long_polling_timeout"):
        wanted = duration_ms(request.long_polling_timeout)
    else:
        wanted = MAX_POLLING_MS if remaining_ms is None else remaining_ms - MIN_POLLING_MS
    wanted = min(max(wanted, MIN_POLLING_MS), MAX_POLLING_MS)
    if remaining_ms is None or wanted <= remaining_ms:
        return wanted
    if remaining_ms >= MIN_POLLING_MS:
        return remaining_ms
    raise V2Error(
        v2.ILLEGAL_POLLING_TIME,
        f"the call has {max(remaining_ms, 0)} ms left, under the {MIN_POLLING_MS} ms a "
        "receive needs: give the call a longer deadline",
    )


def _invisible_ms(request: v2s.ReceiveMessageRequest) -> int:
    if not request.HasField("invisible_duration"):
        if request.auto_renew:
            return AUTO_RENEW_INVISIBLE_MS
        raise V2Error(v2.ILLEGAL_INVISIBLE_TIME, "invisible_duration is missing")
    return _check_invisible(
        duration_ms(request.invisible_duration), POP_INVISIBLE_MIN_MS, "invisible_duration"
    )


def _check_invisible(value_ms: int, min_ms: int, field: str) -> int:
    if not min_ms <= value_ms <= POP_INVISIBLE_MAX_MS:
        raise V2Error(
            v2.ILLEGAL_INVISIBLE_TIME,
            f"{field} is {value_ms} ms; give {min_ms} ms .. {POP_INVISIBLE_MAX_MS} ms "
            "(POP_INVISIBLE_MIN_MS .. POP_INVISIBLE_MAX_MS)",
        )
    return value_ms


def _expression(filter_expression: v2.FilterExpression) -> str:
    if filter_expression.type == v2.SQL:
        raise V2Error(
            v2.ILLEGAL_FILTER_EXPRESSION,
            "SQL92 filter expressions are not supported by Tide: filter by tag",
        )
    return filter_expression.expression or "*"


def _handle(receipt_handle: str, field: str) -> str:
    if not receipt_handle or len(receipt_handle) > RECEIPT_HANDLE_MAX_CHARS:
        raise V2Error(
            v2.INVALID_RECEIPT_HANDLE,
            f"{field} is {len(receipt_handle)} characters: give the receipt handle a "
            f"receive returned (at most {RECEIPT_HANDLE_MAX_CHARS}: RECEIPT_HANDLE_MAX_CHARS)",
        )
    return receipt_handle


def receive_request(
    request: v2s.ReceiveMessageRequest, remaining_ms: int | None, client_id: str
) -> pb.ReceiveRequest:
    group = group_of(request.group)
    topic = topic_of(request.message_queue.topic, "message_queue.topic")
    polling = polling_ms(request, remaining_ms)
    if not 1 <= request.batch_size <= RECEIVE_BATCH_MAX:
        raise V2Error(
            v2.BAD_REQUEST, f"batch_size is {request.batch_size}; give 1 .. {RECEIVE_BATCH_MAX}"
        )
    receive = pb.ReceiveRequest(
        consumer_group=group,
        topic=topic,
        expression=_expression(request.filter_expression),
        max_messages=request.batch_size,
        invisible_duration_ms=_invisible_ms(request),
        long_poll_timeout_ms=polling,
        client_id=client_id,
    )
    broker = request.message_queue.broker.name
    if broker:  # an assignment (push consumers): that broker's queues
        receive.queue.CopyFrom(pb.QueueRef(broker_name=broker, queue_id=-1))
    return receive


async def receive_message(
    pop: PopApi | None,
    request: v2s.ReceiveMessageRequest,
    remaining_ms: int | None,
    client_id: str,
) -> AsyncIterator[v2s.ReceiveMessageResponse]:
    """status, then the messages, then the delivery timestamp (module doc)."""
    try:
        receive = receive_request(request, remaining_ms, client_id)
        deadline_ms = None if remaining_ms is None else time.time_ns() // 1_000_000 + remaining_ms
        received = await _pop(pop).receive(receive, deadline_ms=deadline_ms)
    except Exception as exc:
        yield v2s.ReceiveMessageResponse(status=status_of(exc, v2.TOPIC_NOT_FOUND))
        return
    if not received.messages:
        yield v2s.ReceiveMessageResponse(status=status(v2.MESSAGE_NOT_FOUND, "no new message"))
    else:
        yield v2s.ReceiveMessageResponse(status=OK)
        for item in received.messages:
            yield v2s.ReceiveMessageResponse(message=_received(item, receive))
    yield v2s.ReceiveMessageResponse(
        delivery_timestamp=to_timestamp(received.delivery_timestamp_ms)
    )


def _received(item: pb.ReceivedMessage, receive: pb.ReceiveRequest) -> v2.Message:
    message = v2_message(item.message)
    system = message.system_properties
    system.receipt_handle = item.receipt_handle
    system.delivery_attempt = item.delivery_attempt
    system.invisible_duration.CopyFrom(to_duration(receive.invisible_duration_ms))
    return message


async def ack_message(pop: PopApi | None, request: v2s.AckMessageRequest) -> v2s.AckMessageResponse:
    try:
        group = group_of(request.group)
        topic = topic_of(request.topic)
        if not request.entries:
            raise V2Error(v2.BAD_REQUEST, "entries is empty: give the receipt handles to ack")
        if len(request.entries) > ACK_ENTRIES_MAX_COUNT:
            raise V2Error(
                v2.BAD_REQUEST,
                f"entries has {len(request.entries)}; the limit is {ACK_ENTRIES_MAX_COUNT} "
                "(ACK_ENTRIES_MAX_COUNT)",
            )
        for index, entry in enumerate(request.entries):
            _handle(entry.receipt_handle, f"entries[{index}].receipt_handle")
        acked = await _pop(pop).ack(
            pb.AckRequest(
                consumer_group=group,
                topic=topic,
                entries=[pb.AckEntry(receipt_handle=e.receipt_handle) for e in request.entries],
            )
        )
    except Exception as exc:
        return v2s.AckMessageResponse(status=status_of(exc, v2.TOPIC_NOT_FOUND))
    entries = [
        v2s.AckMessageResultEntry(
            message_id=entry.message_id,
            receipt_handle=entry.receipt_handle,
            status=OK if result.error == pb.POP_ERROR_NONE else status_of(_pop_error(result)),
        )
        for entry, result in zip(request.entries, acked.results, strict=True)
    ]
    codes = {entry.status.code for entry in entries}
    top = entries[0].status if len(codes) == 1 else status(v2.MULTIPLE_RESULTS, "MULTIPLE_RESULTS")
    return v2s.AckMessageResponse(status=top, entries=entries)


def _pop_error(result: pb.AckResult) -> Exception:
    return PopError(result.error, result.error_message or "the receipt handle was refused")


async def change_invisible_duration(
    pop: PopApi | None, request: v2s.ChangeInvisibleDurationRequest
) -> v2s.ChangeInvisibleDurationResponse:
    try:
        group = group_of(request.group)
        topic = topic_of(request.topic)
        handle = _handle(request.receipt_handle, "receipt_handle")
        # 0 .. 10 s too: a push consumer's retry backoff (the proxy accepts it).
        invisible = _check_invisible(
            duration_ms(request.invisible_duration), 0, "invisible_duration"
        )
        changed = await _pop(pop).change_invisible_duration(
            pb.ChangeInvisibleDurationRequest(
                consumer_group=group,
                topic=topic,
                receipt_handle=handle,
                invisible_duration_ms=invisible,
            )
        )
    except Exception as exc:
        return v2s.ChangeInvisibleDurationResponse(status=status_of(exc, v2.TOPIC_NOT_FOUND))
    return v2s.ChangeInvisibleDurationResponse(status=OK, receipt_handle=changed.receipt_handle)


async def forward_to_dead_letter(
    pop: PopApi | None, request: v2s.ForwardMessageToDeadLetterQueueRequest
) -> v2s.ForwardMessageToDeadLetterQueueResponse:
    try:
        group = group_of(request.group)
        topic = topic_of(request.topic)
        handle = _handle(request.receipt_handle, "receipt_handle")
        await _pop(pop).forward_to_dead_letter(
            pb.ForwardToDeadLetterRequest(consumer_group=group, topic=topic, receipt_handle=handle)
        )
    except Exception as exc:
        return v2s.ForwardMessageToDeadLetterQueueResponse(
            status=status_of(exc, v2.TOPIC_NOT_FOUND)
        )
    return v2s.ForwardMessageToDeadLetterQueueResponse(status=OK)


def _pop(pop: PopApi | None) -> PopApi:
    if pop is None:
        raise V2Error(
            v2.NOT_IMPLEMENTED, "POP consumption is not in this gateway build (issue 20, pop)"
        )
    return pop

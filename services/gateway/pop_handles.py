"""The POP calls on receipt handles (Ack, ChangeInvisibleDuration, ForwardToDeadLetter)
and GetGroupLag (issue 20, docs/pop.md).

A handle names its broker; the call goes to that broker's master's dispatch, which
checks the checkpoint is held, is the group's and topic's, and is not past its invisible
time. Reasons (pop_errors.py): a handle that does not decode, or that the broker does not
hold for this group and topic -> INVALID_RECEIPT_HANDLE; one past its invisible time ->
RECEIPT_HANDLE_EXPIRED; a broker that cannot be reached -> UNAVAILABLE.
"""

from __future__ import annotations

import time

import grpc

from services.gateway.brokers import BrokerChannels, rpc_problem
from services.gateway.options import GatewayConfig
from services.gateway.pop_errors import PopError
from services.gateway.routes import PERM_READ, Member, RouteCache
from services.gateway.validate import check_group, check_topic, invalid
from tide.format import ReceiptHandle, ReceiptHandleError, decode_handle, encode_handle
from tide.limits import ACK_ENTRIES_MAX_COUNT, POP_INVISIBLE_MAX_MS, RECEIPT_HANDLE_MAX_CHARS
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import gateway_pb2 as pb

INVALID = pb.POP_ERROR_INVALID_RECEIPT_HANDLE
EXPIRED = pb.POP_ERROR_RECEIPT_HANDLE_EXPIRED
UNAVAILABLE = pb.POP_ERROR_UNAVAILABLE
# The dispatch's per-entry codes (PopAckResult.code) as reasons.
_REASONS = {
    grpc.StatusCode.NOT_FOUND.value[0]: INVALID,
    grpc.StatusCode.INVALID_ARGUMENT.value[0]: INVALID,
    grpc.StatusCode.FAILED_PRECONDITION.value[0]: EXPIRED,
}


def parse_handle(text: str) -> ReceiptHandle:
    """The handle, or PopError INVALID_RECEIPT_HANDLE (expired: RECEIPT_HANDLE_EXPIRED)."""
    if not text:
        raise PopError(INVALID, "receipt_handle is empty; give the handle a Receive answered")
    if len(text) > RECEIPT_HANDLE_MAX_CHARS:
        raise PopError(
            INVALID,
            f"receipt_handle is {len(text)} characters; a handle is at most "
            f"{RECEIPT_HANDLE_MAX_CHARS} (RECEIPT_HANDLE_MAX_CHARS)",
        )
    try:
        handle = decode_handle(text)
    except ReceiptHandleError as exc:
        raise PopError(INVALID, f"receipt_handle {quote(text)}: {exc}") from None
    if handle.invisible_until_ms <= _now_ms():
        raise PopError(
            EXPIRED,
            f"receipt handle expired at {handle.invisible_until_ms} ms: the message is "
            "delivered again; ack the new delivery",
        )
    return handle


def _entry(handle: ReceiptHandle) -> dispatch_pb.PopAckEntry:
    return dispatch_pb.PopAckEntry(
        checkpoint_offset=handle.checkpoint_offset,
        queue_id=handle.queue_id,
        queue_offset=handle.queue_offset,
    )


class PopHandles:
    def __init__(self, config: GatewayConfig, routes: RouteCache, channels: BrokerChannels) -> None:
        self._config = config
        self._routes = routes
        self._channels = channels

    async def _master(self, topic: str, broker_name: str) -> Member:
        view = await self._routes.get(topic)
        master = view.master(broker_name)
        if master is None:
            view = await self._routes.get(topic, refresh=True)
            master = view.master(broker_name)
        if master is None:
            raise PopError(
                UNAVAILABLE,
                f"broker {quote(broker_name)} that gave out the receipt handle has no live "
                f"master for topic {quote(topic)}; retry when it is back",
            )
        return master

    def _rpc_error(self, exc: grpc.aio.AioRpcError, call: str) -> ServiceError:
        code = exc.code()
        if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
            return PopError(INVALID, f"receipt handle refused: {exc.details()}")
        if code is grpc.StatusCode.FAILED_PRECONDITION and "invisible time" in (
            exc.details() or ""
        ):
            return PopError(EXPIRED, f"receipt handle expired: {exc.details()}")
        return PopError(UNAVAILABLE, f"{call}: {rpc_problem(exc)}")

    # -- Ack --------------------------------------------------------------------------
    async def ack(self, request: pb.AckRequest) -> pb.AckResponse:
        check_group(request.consumer_group)
        check_topic(request.topic)
        if not 1 <= len(request.entries) <= ACK_ENTRIES_MAX_COUNT:
            raise invalid(
                f"entries has {len(request.entries)} receipt handles; give 1 to "
                f"{ACK_ENTRIES_MAX_COUNT} (ACK_ENTRIES_MAX_COUNT)"
            )
        results = [pb.AckResult(receipt_handle=e.receipt_handle) for e in request.entries]
        by_broker: dict[str, list[tuple[int, ReceiptHandle]]] = {}
        for index, entry in enumerate(request.entries):
            try:
                handle = parse_handle(entry.receipt_handle)
            except PopError as exc:
                results[index].error, results[index].error_message = exc.reason, exc.message
                continue
            by_broker.setdefault(handle.broker_name, []).append((index, handle))
        for broker_name, handles in by_broker.items():
            await self._ack_on(request, broker_name, handles, results)
        return pb.AckResponse(results=results)

    async def _ack_on(
        self,
        request: pb.AckRequest,
        broker_name: str,
        handles: list[tuple[int, ReceiptHandle]],
        results: list[pb.AckResult],
    ) -> None:
        call = dispatch_pb.PopAckRequest(
            consumer_group=request.consumer_group,
            topic=request.topic,
            entries=[_entry(handle) for _, handle in handles],
        )
        try:
            master = await self._master(request.topic, broker_name)
            answer: dispatch_pb.PopAckResponse = await self._channels.dispatch(
                master.dispatch
            ).PopAck(call, timeout=self._config.broker_timeout_s)
        except (grpc.aio.AioRpcError, ServiceError) as exc:
            error = (
                self._rpc_error(exc, f"PopAck on broker {quote(broker_name)}")
                if isinstance(exc, grpc.aio.AioRpcError)
                else exc
            )
            reason = error.reason if isinstance(error, PopError) else UNAVAILABLE
            for index, _ in handles:
                results[index].error, results[index].error_message = reason, error.message
            return
        for (index, _), result in zip(handles, answer.results, strict=True):
            if result.code:
                results[index].error = _REASONS.get(result.code, UNAVAILABLE)
                results[index].error_message = result.message

    # -- ChangeInvisibleDuration ------------------------------------------------------
    async def change_invisible_duration(
        self, request: pb.ChangeInvisibleDurationRequest
    ) -> pb.ChangeInvisibleDurationResponse:
        check_group(request.consumer_group)
        check_topic(request.topic)
        duration = request.invisible_duration_ms
        if not 0 <= duration <= POP_INVISIBLE_MAX_MS:
            raise invalid(
                f"invisible_duration_ms must be in 0..{POP_INVISIBLE_MAX_MS} "
                f"(POP_INVISIBLE_MAX_MS: 12 h; got {duration})"
            )
        handle = parse_handle(request.receipt_handle)
        master = await self._master(request.topic, handle.broker_name)
        call = dispatch_pb.PopChangeInvisibleRequest(
            consumer_group=request.consumer_group,
            topic=request.topic,
            entry=_entry(handle),
            invisible_duration_ms=duration,
        )
        try:
            answer: dispatch_pb.PopChangeInvisibleResponse = await self._channels.dispatch(
                master.dispatch
            ).PopChangeInvisible(call, timeout=self._config.broker_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(
                exc, f"PopChangeInvisible on {quote(handle.broker_name)}"
            ) from exc
        new = ReceiptHandle(
            checkpoint_offset=answer.checkpoint_offset,
            queue_id=handle.queue_id,
            queue_offset=handle.queue_offset,
            invisible_until_ms=answer.invisible_until_ms,
            retry=handle.retry,
            broker_name=handle.broker_name,
        )
        return pb.ChangeInvisibleDurationResponse(
            receipt_handle=encode_handle(new), invisible_until_ms=answer.invisible_until_ms
        )

    # -- ForwardToDeadLetter --------------------------------------------------------------
    async def forward_to_dead_letter(
        self, request: pb.ForwardToDeadLetterRequest
    ) -> pb.ForwardToDeadLetterResponse:
        check_group(request.consumer_group)
        check_topic(request.topic)
        handle = parse_handle(request.receipt_handle)
        master = await self._master(request.topic, handle.broker_name)
        call = dispatch_pb.PopDeadLetterRequest(
            consumer_group=request.consumer_group, topic=request.topic, entry=_entry(handle)
        )
        try:
            answer: dispatch_pb.PopDeadLetterResponse = await self._channels.dispatch(
                master.dispatch
            ).PopDeadLetter(call, timeout=self._config.broker_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(exc, f"PopDeadLetter on {quote(handle.broker_name)}") from exc
        return pb.ForwardToDeadLetterResponse(topic=answer.topic, msg_id=answer.msg_id)

    # -- GetGroupLag ------------------------------------------------------------------
    async def group_lag(self, request: pb.GetGroupLagRequest) -> pb.GetGroupLagResponse:
        check_group(request.consumer_group)
        check_topic(request.topic)
        view = await self._routes.get(request.topic)
        response = pb.GetGroupLagResponse()
        for name in sorted(view.queue_data):
            data = view.queue_data[name]
            master = view.master(name)
            if master is None or not data.perm & PERM_READ:
                continue
            call = dispatch_pb.GetPopLagRequest(
                consumer_group=request.consumer_group,
                topic=request.topic,
                queue_ids=list(range(data.read_queue_nums)),
            )
            try:
                answer: dispatch_pb.GetPopLagResponse = await self._channels.dispatch(
                    master.dispatch
                ).GetPopLag(call, timeout=self._config.broker_timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise ServiceError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"GetPopLag on broker {quote(name)}: {rpc_problem(exc)}",
                ) from exc
            for queue in answer.queues:
                response.queues.append(
                    pb.QueueLag(
                        broker_name=name,
                        queue_id=queue.queue_id,
                        max_offset=queue.max_offset,
                        consumer_offset=queue.consumer_offset,
                        ready=max(0, queue.max_offset - max(queue.consumer_offset, 0)),
                        inflight=queue.inflight,
                    )
                )
                response.ready += response.queues[-1].ready
                response.inflight += queue.inflight
            response.delayed += answer.delayed
        return response


def _now_ms() -> int:
    return time.time_ns() // 1_000_000

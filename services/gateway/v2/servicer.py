"""``apache.rocketmq.v2.MessagingService``: each call handed to its area's module.

Every answer carries its status in the message (status.py); a call never fails with a
gRPC error of its own. Client metadata: ``x-mq-client-id`` names the client (its POP
receives); ``authorization`` (the clients' HMAC signature) is accepted and not verified
yet (docs/rocketmq5.md: the security issue verifies it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from services.gateway.consumers import Consumers
from services.gateway.pull import Puller
from services.gateway.recall import Recaller
from services.gateway.transactions import Transactions
from services.gateway.v2 import consume, offsets
from services.gateway.v2.routes import V2Routes
from services.gateway.v2.send import V2Sender, recall
from services.gateway.v2.status import OK, V2Error, group_of, status, status_of
from services.gateway.v2.telemetry import Telemetry
from services.gateway.v2.transactions import end_transaction
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.rocketmq_v2 import service_pb2_grpc as v2_grpc

Context = grpc.aio.ServicerContext[object, object]
CLIENT_ID_HEADER = "x-mq-client-id"
CLIENT_ID_MAX_CHARS = 256  # longer client ids are cut: it only names the client


def client_id(context: Context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_HEADER and isinstance(value, str):
            return value[:CLIENT_ID_MAX_CHARS]
    return ""


def remaining_ms(context: Context) -> int | None:
    left_s = context.time_remaining()
    return None if left_s is None else int(left_s * 1000)


class MessagingServicer(v2_grpc.MessagingServiceServicer):
    def __init__(
        self,
        routes: V2Routes,
        sender: V2Sender,
        telemetry: Telemetry,
        transactions: Transactions,
        recaller: Recaller,
        puller: Puller,
        consumers: Consumers,
        pop: consume.PopApi | None,
    ) -> None:
        self._routes = routes
        self._sender = sender
        self._telemetry = telemetry
        self._transactions = transactions
        self._recaller = recaller
        self._puller = puller
        self._consumers = consumers
        self._pop = pop

    def drain(self) -> None:
        """Shutdown has begun: end the open Telemetry streams."""
        self._telemetry.drain()

    async def QueryRoute(
        self, request: v2s.QueryRouteRequest, context: Context
    ) -> v2s.QueryRouteResponse:
        return await self._routes.query_route(request)

    async def Heartbeat(
        self, request: v2s.HeartbeatRequest, context: Context
    ) -> v2s.HeartbeatResponse:
        # Clients are known by their Telemetry stream; a heartbeat only checks the group.
        try:
            if request.HasField("group"):
                group_of(request.group)
        except V2Error as exc:
            return v2s.HeartbeatResponse(status=status_of(exc))
        return v2s.HeartbeatResponse(status=OK)

    async def SendMessage(
        self, request: v2s.SendMessageRequest, context: Context
    ) -> v2s.SendMessageResponse:
        return await self._sender.send(request, context.peer())

    async def QueryAssignment(
        self, request: v2s.QueryAssignmentRequest, context: Context
    ) -> v2s.QueryAssignmentResponse:
        return await self._routes.query_assignment(request)

    async def ReceiveMessage(
        self, request: v2s.ReceiveMessageRequest, context: Context
    ) -> AsyncIterator[v2s.ReceiveMessageResponse]:
        async for response in consume.receive_message(
            self._pop, request, remaining_ms(context), client_id(context)
        ):
            yield response

    async def AckMessage(
        self, request: v2s.AckMessageRequest, context: Context
    ) -> v2s.AckMessageResponse:
        return await consume.ack_message(self._pop, request)

    async def ForwardMessageToDeadLetterQueue(
        self, request: v2s.ForwardMessageToDeadLetterQueueRequest, context: Context
    ) -> v2s.ForwardMessageToDeadLetterQueueResponse:
        return await consume.forward_to_dead_letter(self._pop, request)

    async def ChangeInvisibleDuration(
        self, request: v2s.ChangeInvisibleDurationRequest, context: Context
    ) -> v2s.ChangeInvisibleDurationResponse:
        return await consume.change_invisible_duration(self._pop, request)

    async def PullMessage(
        self, request: v2s.PullMessageRequest, context: Context
    ) -> AsyncIterator[v2s.PullMessageResponse]:
        async for response in offsets.pull_message(self._puller, request):
            yield response

    async def UpdateOffset(
        self, request: v2s.UpdateOffsetRequest, context: Context
    ) -> v2s.UpdateOffsetResponse:
        return await offsets.update_offset(self._consumers, request)

    async def GetOffset(
        self, request: v2s.GetOffsetRequest, context: Context
    ) -> v2s.GetOffsetResponse:
        return await offsets.get_offset(self._consumers, request)

    async def QueryOffset(
        self, request: v2s.QueryOffsetRequest, context: Context
    ) -> v2s.QueryOffsetResponse:
        return await offsets.query_offset(self._consumers, request)

    async def EndTransaction(
        self, request: v2s.EndTransactionRequest, context: Context
    ) -> v2s.EndTransactionResponse:
        return await end_transaction(self._transactions, request)

    async def Telemetry(
        self, request_iterator: AsyncIterator[v2s.TelemetryCommand], context: Context
    ) -> AsyncIterator[v2s.TelemetryCommand]:
        async for command in self._telemetry.serve(request_iterator):
            yield command

    async def NotifyClientTermination(
        self, request: v2s.NotifyClientTerminationRequest, context: Context
    ) -> v2s.NotifyClientTerminationResponse:
        # Nothing is kept per client: its receipt handles expire on their own.
        return v2s.NotifyClientTerminationResponse(status=OK)

    async def RecallMessage(
        self, request: v2s.RecallMessageRequest, context: Context
    ) -> v2s.RecallMessageResponse:
        return await recall(self._recaller, request)

    async def SyncLiteSubscription(
        self, request: v2s.SyncLiteSubscriptionRequest, context: Context
    ) -> v2s.SyncLiteSubscriptionResponse:
        return v2s.SyncLiteSubscriptionResponse(
            status=status(v2.UNSUPPORTED, "lite topics are not supported by Tide")
        )

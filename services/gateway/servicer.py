"""``tide.v1.Gateway``: each call handed to the part that does it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc

from services.gateway.admin import Admin
from services.gateway.auth.admin import AuthAdminRpcs
from services.gateway.consumers import Consumers
from services.gateway.pop import PopConsumers
from services.gateway.produce import Producer
from services.gateway.produce_stream import ProduceStreams
from services.gateway.pull import Puller
from services.gateway.query import Querier
from services.gateway.queue_locks import QueueLocks
from services.gateway.recall import Recaller
from services.gateway.send_back import SendBacks
from services.gateway.transactions import Transactions
from services.gateway.validate import check_produce_size
from tide.server import ByteBudget
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.v1 import nameserver_pb2 as ns_pb
from tide.v1 import storage_pb2 as storage_pb

Context = grpc.aio.ServicerContext[object, object]


class GatewayServicer(AuthAdminRpcs, pb_grpc.GatewayServicer):
    def __init__(
        self,
        producer: Producer,
        puller: Puller,
        querier: Querier,
        consumers: Consumers,
        admin: Admin,
        send_backs: SendBacks,
        produce_in_flight_bytes: int,
        produce_stream_in_flight_bytes: int,
        recaller: Recaller,
        transactions: Transactions,
        queue_locks: QueueLocks,
        pop: PopConsumers,
    ) -> None:
        self._producer = producer
        self._puller = puller
        self._querier = querier
        self._consumers = consumers
        self._admin = admin
        self._send_backs = send_backs
        self._recaller = recaller
        self._transactions = transactions
        self._queue_locks = queue_locks
        self._pop = pop
        # The bytes of the produce requests being processed (Produce and ProduceStream):
        # past it, RESOURCE_EXHAUSTED naming max_produce_in_flight_bytes.
        self.produce_budget = ByteBudget(
            "max_produce_in_flight_bytes",
            produce_in_flight_bytes,
            "produce requests in flight on this gateway",
        )
        # ProduceStream; its ``produce`` (one request) is wrapped by the metrics.
        self.produce_streams = ProduceStreams(
            producer.produce, self.produce_budget, produce_stream_in_flight_bytes
        )

    def drain(self) -> None:
        """Shutdown: end the open ProduceStream calls (after answering what they read)."""
        self.produce_streams.drain()

    async def Produce(self, request: pb.ProduceRequest, context: Context) -> pb.ProduceResponse:
        wire = request.SerializeToString()  # its size, and the produce's bytes path
        check_produce_size(len(wire))  # first: a permanent refusal, not a retryable one
        with self.produce_budget.held(len(wire)):
            return await self._producer.produce(request, context.peer(), len(wire), wire)

    async def ProduceStream(
        self, request_iterator: AsyncIterator[pb.ProduceRequest], context: Context
    ) -> AsyncIterator[pb.ProduceStreamResponse]:
        async for response in self.produce_streams.serve(request_iterator, context.peer()):
            yield response

    async def Pull(self, request: pb.PullRequest, context: Context) -> pb.PullResponse:
        return await self._puller.pull(request)

    async def BrowseQueue(self, request: pb.PullRequest, context: Context) -> pb.PullResponse:
        return await self._puller.pull(request, browse=True)

    async def SendBack(self, request: pb.SendBackRequest, context: Context) -> pb.SendBackResponse:
        return await self._send_backs.send_back(request)

    async def RecallMessage(
        self, request: pb.RecallMessageRequest, context: Context
    ) -> pb.RecallMessageResponse:
        return await self._recaller.recall(request)

    async def EndTransaction(
        self, request: pb.EndTransactionRequest, context: Context
    ) -> pb.EndTransactionResponse:
        return await self._transactions.end(request)

    async def TransactionChecks(
        self, request: pb.TransactionChecksRequest, context: Context
    ) -> AsyncIterator[pb.TransactionCheck]:
        async for check in self._transactions.checks(request):
            yield check

    async def ListTransactions(
        self, request: pb.ListTransactionsRequest, context: Context
    ) -> pb.ListTransactionsResponse:
        return await self._transactions.list_halves(request)

    async def QueryMessage(
        self, request: pb.QueryMessageRequest, context: Context
    ) -> pb.QueryMessageResponse:
        return await self._querier.query(request)

    async def GetQueueOffsets(
        self, request: pb.QueueOffsetsRequest, context: Context
    ) -> pb.QueueOffsetsResponse:
        return await self._consumers.queue_offsets(request)

    async def SearchOffset(
        self, request: pb.SearchQueueOffsetRequest, context: Context
    ) -> pb.SearchQueueOffsetResponse:
        return await self._consumers.search_offset(request)

    async def CommitOffset(
        self, request: pb.CommitConsumerOffsetRequest, context: Context
    ) -> pb.CommitConsumerOffsetResponse:
        return await self._consumers.commit_offset(request)

    async def GetOffset(
        self, request: pb.GetConsumerOffsetRequest, context: Context
    ) -> pb.GetConsumerOffsetResponse:
        return await self._consumers.get_offset(request)

    async def Heartbeat(
        self, request: storage_pb.ConsumerHeartbeatRequest, context: Context
    ) -> storage_pb.ConsumerHeartbeatResponse:
        return await self._consumers.heartbeat(request)

    async def UnregisterConsumer(
        self, request: storage_pb.UnregisterConsumerRequest, context: Context
    ) -> storage_pb.UnregisterConsumerResponse:
        return await self._consumers.unregister(request)

    async def GetConsumers(
        self, request: storage_pb.GetConsumersRequest, context: Context
    ) -> storage_pb.GetConsumersResponse:
        return await self._consumers.consumers(request)

    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: Context
    ) -> pb.CreateTopicResponse:
        return await self._admin.create_topic(request)

    async def DeleteTopic(
        self, request: storage_pb.DeleteTopicRequest, context: Context
    ) -> storage_pb.DeleteTopicResponse:
        return await self._admin.delete_topic(request)

    async def ListTopics(
        self, request: ns_pb.ListRouteTopicsRequest, context: Context
    ) -> ns_pb.ListRouteTopicsResponse:
        return await self._admin.list_topics(request.include_hidden)

    async def GetTopicRoute(
        self, request: ns_pb.GetTopicRouteRequest, context: Context
    ) -> ns_pb.TopicRoute:
        return await self._admin.topic_route(request)

    async def CreateGroup(
        self, request: pb.CreateGroupRequest, context: Context
    ) -> pb.CreateGroupResponse:
        return await self._admin.groups.create(request)

    async def GetGroup(
        self, request: storage_pb.GetGroupRequest, context: Context
    ) -> storage_pb.GetGroupResponse:
        return await self._admin.groups.get(request)

    async def ListGroups(
        self, request: storage_pb.ListGroupsRequest, context: Context
    ) -> storage_pb.ListGroupsResponse:
        return await self._admin.groups.list_groups(request)

    async def DeleteGroup(
        self, request: storage_pb.DeleteGroupRequest, context: Context
    ) -> storage_pb.DeleteGroupResponse:
        return await self._admin.groups.delete(request)

    async def GetClusterInfo(
        self, request: ns_pb.GetClusterInfoRequest, context: Context
    ) -> ns_pb.ClusterInfo:
        return await self._admin.cluster_info(request)

    # fifo (issue 19)
    async def LockQueues(
        self, request: pb.BrokerQueueLockRequest, context: Context
    ) -> storage_pb.QueueLockResponse:
        return await self._queue_locks.lock(request)

    async def UnlockQueues(
        self, request: pb.BrokerQueueLockRequest, context: Context
    ) -> storage_pb.QueueUnlockResponse:
        return await self._queue_locks.unlock(request)

    async def GetQueueLocks(
        self, request: storage_pb.GetQueueLocksRequest, context: Context
    ) -> storage_pb.GetQueueLocksResponse:
        return await self._queue_locks.locks(request)

    # -- pop (issue 20) ------------------------------------------------------------------
    async def Receive(self, request: pb.ReceiveRequest, context: Context) -> pb.ReceiveResponse:
        remaining_s = context.time_remaining()
        deadline_ms = None
        if remaining_s is not None:
            deadline_ms = time.time_ns() // 1_000_000 + int(remaining_s * 1000)
        return await self._pop.receive(request, deadline_ms=deadline_ms)

    async def Ack(self, request: pb.AckRequest, context: Context) -> pb.AckResponse:
        return await self._pop.ack(request)

    async def ChangeInvisibleDuration(
        self, request: pb.ChangeInvisibleDurationRequest, context: Context
    ) -> pb.ChangeInvisibleDurationResponse:
        return await self._pop.change_invisible_duration(request)

    async def ForwardToDeadLetter(
        self, request: pb.ForwardToDeadLetterRequest, context: Context
    ) -> pb.ForwardToDeadLetterResponse:
        return await self._pop.forward_to_dead_letter(request)

    async def GetGroupLag(
        self, request: pb.GetGroupLagRequest, context: Context
    ) -> pb.GetGroupLagResponse:
        return await self._pop.group_lag(request)

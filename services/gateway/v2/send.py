"""SendMessage and RecallMessage: v2 messages onto the gateway's Producer and Recaller.

The checks that have a RocketMQ code of their own come first (message id, topic, body
size, message group), with the proxy's codes; the rest is the Producer's (one Produce
of the request's messages), its errors mapped by status.status_of. Each entry answers
the client's message id unchanged; the top-level status is the entries' code when they
agree, else MULTIPLE_RESULTS (never code 0: the clients treat it as a failure).
"""

from __future__ import annotations

import grpc

from services.gateway.produce import Producer
from services.gateway.recall import Recaller
from services.gateway.routes import RouteCache
from services.gateway.v2.messages import body_of, timestamp_ms
from services.gateway.v2.routes import accepted_types
from services.gateway.v2.status import OK, V2Error, status, status_of, topic_of
from tide.format import HalfLocation, encode_v2_transaction_id
from tide.limits import UNIQUE_KEY_MAX_CHARS
from tide.quoting import quote
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.server import ByteBudget, ServiceError
from tide.v1 import gateway_pb2 as pb

DELIVERY_FIELD = "deliver_at_ms"  # what the Producer's delivery time errors name
_ENTRY_CODES = {
    pb.ProduceResult.SEND_OK: v2.OK,
    pb.ProduceResult.FLUSH_DISK_TIMEOUT: v2.MASTER_PERSISTENCE_TIMEOUT,
    pb.ProduceResult.FLUSH_SLAVE_TIMEOUT: v2.SLAVE_PERSISTENCE_TIMEOUT,
    pb.ProduceResult.SLAVE_NOT_AVAILABLE: v2.HA_NOT_AVAILABLE,
    pb.ProduceResult.SEND_FAILED: v2.INTERNAL_SERVER_ERROR,
}


class V2Sender:
    def __init__(
        self,
        producer: Producer,
        recaller: Recaller,
        budget: ByteBudget,
        max_body_bytes: int,
        routes: RouteCache,
        type_check: bool,
    ) -> None:
        self._producer = producer
        self._routes = routes
        self._type_check = type_check  # the gateway's --topic-message-type-check
        self._recaller = recaller
        # The same in-flight budget as tide.v1's Produce: past it, TOO_MANY_REQUESTS.
        self._budget = budget
        self._max_body_bytes = max_body_bytes

    async def send(self, request: v2s.SendMessageRequest, peer: str) -> v2s.SendMessageResponse:
        try:
            produce = self._produce_request(request)
            if self._type_check:
                await self._check_types(request)
            size_bytes = produce.ByteSize()
            with self._budget.held(size_bytes):
                produced = await self._producer.produce(produce, peer, size_bytes)
        except ServiceError as exc:
            if exc.code is grpc.StatusCode.INVALID_ARGUMENT and DELIVERY_FIELD in exc.message:
                late = V2Error(v2.ILLEGAL_DELIVERY_TIME, exc.message)  # past the timer's max
                return v2s.SendMessageResponse(status=status_of(late))
            return v2s.SendMessageResponse(status=status_of(exc, v2.TOPIC_NOT_FOUND))
        except Exception as exc:
            return v2s.SendMessageResponse(status=status_of(exc, v2.TOPIC_NOT_FOUND))
        return _response(produce, produced)

    async def _check_types(self, request: v2s.SendMessageRequest) -> None:
        """A message whose type its topic does not accept: MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        as the proxy answers (the Producer's own check would say BAD_REQUEST)."""
        for index, message in enumerate(request.messages):
            try:
                view = await self._routes.get(message.topic.name)
            except ServiceError as exc:
                if exc.code is grpc.StatusCode.NOT_FOUND:
                    continue  # the Producer answers it (or creates the topic: auto-create)
                raise
            accepted = accepted_types(view.message_type)
            message_type = message_type_of(message)
            if message_type not in accepted:
                raise V2Error(
                    v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                    f"messages[{index}] is {v2.MessageType.Name(message_type)} and topic "
                    f"{quote(view.topic)} takes "
                    f"{', '.join(v2.MessageType.Name(t) for t in accepted)} messages: send it "
                    "to a topic of its type (or MIXED)",
                )

    def _produce_request(self, request: v2s.SendMessageRequest) -> pb.ProduceRequest:
        if not request.messages:
            raise V2Error(v2.MESSAGE_CORRUPTED, "messages is empty: send at least one message")
        return pb.ProduceRequest(
            messages=[self._message(i, m) for i, m in enumerate(request.messages)]
        )

    def _message(self, index: int, message: v2.Message) -> pb.ProduceMessage:
        where = f"messages[{index}]"
        topic = topic_of(message.topic, f"{where}.topic")
        system = message.system_properties
        _check_message_id(where, system.message_id)
        if len(message.body) > self._max_body_bytes:
            raise V2Error(
                v2.MESSAGE_BODY_TOO_LARGE,
                f"{where}: the body is {len(message.body)} bytes; the limit is "
                f"{self._max_body_bytes} bytes (the gateway's --max-message-body-bytes)",
            )
        produced = pb.ProduceMessage(
            topic=topic,
            body=body_of(message, self._max_body_bytes),
            tags=system.tag,
            keys=system.keys,
            properties=message.user_properties,
            unique_key=system.message_id,
            born_timestamp_ms=timestamp_ms(system.born_timestamp),
        )
        if system.HasField("message_group"):
            if not system.message_group.strip():
                raise V2Error(
                    v2.ILLEGAL_MESSAGE_GROUP, f"{where}: the message group is only whitespace"
                )
            produced.sharding_key = system.message_group
        if system.HasField("delivery_timestamp"):
            produced.deliver_at_ms = max(1, timestamp_ms(system.delivery_timestamp))
        if system.message_type == v2.TRANSACTION:
            produced.transactional = True
            produced.producer_group = topic  # RocketMQ 5's proxy: producers go by topic
        return produced


def message_type_of(message: v2.Message) -> v2.MessageType.ValueType:
    """The type the client gave, else the one its fields make it."""
    system = message.system_properties
    if system.message_type != v2.MESSAGE_TYPE_UNSPECIFIED:
        return system.message_type
    if system.HasField("delivery_timestamp"):
        return v2.DELAY
    return v2.FIFO if system.HasField("message_group") else v2.NORMAL


def _check_message_id(where: str, message_id: str) -> None:
    if not message_id:
        raise V2Error(v2.ILLEGAL_MESSAGE_ID, f"{where}: the message id is empty")
    if len(message_id) > UNIQUE_KEY_MAX_CHARS:
        raise V2Error(
            v2.ILLEGAL_MESSAGE_ID,
            f"{where}: the message id {quote(message_id)} is {len(message_id)} characters; "
            f"the limit is {UNIQUE_KEY_MAX_CHARS} (UNIQUE_KEY_MAX_CHARS)",
        )


def _response(produce: pb.ProduceRequest, produced: pb.ProduceResponse) -> v2s.SendMessageResponse:
    entries = []
    for message, result in zip(produce.messages, produced.results, strict=True):
        code = _ENTRY_CODES.get(result.status, v2.INTERNAL_SERVER_ERROR)
        entry = v2s.SendResultEntry(
            status=OK
            if code == v2.OK
            else status(code, result.error or pb.ProduceResult.Status.Name(result.status)),
            message_id=message.unique_key,
            offset=result.queue_offset,
        )
        if result.transaction_id:
            entry.transaction_id = encode_v2_transaction_id(
                HalfLocation(
                    result.broker_name, result.queue_offset, result.msg_id, result.transaction_id
                )
            )
        if message.deliver_at_ms:
            entry.recall_handle = result.msg_id  # RecallMessage takes the timed copy's id
        entries.append(entry)
    codes = {entry.status.code for entry in entries}
    top = entries[0].status if len(codes) == 1 else status(v2.MULTIPLE_RESULTS, "MULTIPLE_RESULTS")
    return v2s.SendMessageResponse(status=top, entries=entries)


async def recall(
    recaller: Recaller, request: v2s.RecallMessageRequest
) -> v2s.RecallMessageResponse:
    try:
        topic_of(request.topic)
        if not request.recall_handle:
            raise V2Error(
                v2.BAD_REQUEST, "recall_handle is empty: give the one SendMessage returned"
            )
        recalled = await recaller.recall(pb.RecallMessageRequest(msg_id=request.recall_handle))
    except Exception as exc:
        return v2s.RecallMessageResponse(status=status_of(exc, v2.NOT_FOUND))
    return v2s.RecallMessageResponse(status=OK, message_id=recalled.unique_key)

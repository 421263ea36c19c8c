"""PullMessage, UpdateOffset, GetOffset and QueryOffset (RocketMQ 5's pull consumer)
onto the gateway's Puller and Consumers: the same offsets as tide.v1's pull groups.

A queue is named by its route entry: ``message_queue.broker.name`` (the Tide broker)
and ``message_queue.id``. PullMessage answers a status (OK, MESSAGE_NOT_FOUND when
nothing new, ILLEGAL_OFFSET out of the queue's range), the messages, then the next
offset.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from services.gateway.consumers import Consumers
from services.gateway.pull import Puller
from services.gateway.v2.messages import duration_ms, timestamp_ms, v2_message
from services.gateway.v2.status import OK, V2Error, group_of, status, status_of, topic_of
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.v1 import gateway_pb2 as pb

PULL_BATCH_MAX = 1024
"""tide.v1 Pull's most messages (1 .. 1024)."""
PULL_LONG_POLL_MAX_MS = 30_000
"""tide.v1 Pull's longest long poll."""


def _queue(queue: v2.MessageQueue) -> tuple[str, str, int]:
    topic = topic_of(queue.topic, "message_queue.topic")
    if not queue.broker.name:
        raise V2Error(
            v2.BAD_REQUEST, "message_queue.broker.name is empty: give the queue QueryRoute named"
        )
    if queue.id < 0:
        raise V2Error(v2.BAD_REQUEST, f"message_queue.id is {queue.id}: give a queue id >= 0")
    return topic, queue.broker.name, queue.id


async def pull_message(
    puller: Puller, request: v2s.PullMessageRequest
) -> AsyncIterator[v2s.PullMessageResponse]:
    try:
        group = group_of(request.group)
        topic, broker, queue_id = _queue(request.message_queue)
        if not 1 <= request.batch_size <= PULL_BATCH_MAX:
            raise V2Error(
                v2.BAD_REQUEST, f"batch_size is {request.batch_size}; give 1 .. {PULL_BATCH_MAX}"
            )
        if request.filter_expression.type == v2.SQL:
            raise V2Error(
                v2.ILLEGAL_FILTER_EXPRESSION,
                "SQL92 filter expressions are not supported by Tide: filter by tag",
            )
        pulled = await puller.pull(
            pb.PullRequest(
                consumer_group=group,
                topic=topic,
                broker_name=broker,
                queue_id=queue_id,
                offset=request.offset,
                max_messages=request.batch_size,
                expression=request.filter_expression.expression or "*",
                long_poll_timeout_ms=min(
                    max(duration_ms(request.long_polling_timeout), 0), PULL_LONG_POLL_MAX_MS
                ),
            )
        )
    except Exception as exc:
        yield v2s.PullMessageResponse(status=status_of(exc, v2.TOPIC_NOT_FOUND))
        return
    if pulled.status == pb.PullResponse.OFFSET_ILLEGAL:
        yield v2s.PullMessageResponse(
            status=status(
                v2.ILLEGAL_OFFSET,
                f"offset {request.offset} is outside the queue's {pulled.min_offset} .. "
                f"{pulled.max_offset}",
            )
        )
    elif pulled.status == pb.PullResponse.FOUND:
        yield v2s.PullMessageResponse(status=OK)
        for stored in pulled.messages:
            yield v2s.PullMessageResponse(message=v2_message(stored))
    else:
        yield v2s.PullMessageResponse(status=status(v2.MESSAGE_NOT_FOUND, "no new message"))
    yield v2s.PullMessageResponse(next_offset=pulled.next_offset)


async def update_offset(
    consumers: Consumers, request: v2s.UpdateOffsetRequest
) -> v2s.UpdateOffsetResponse:
    try:
        group = group_of(request.group)
        topic, broker, queue_id = _queue(request.message_queue)
        if request.offset < 0:
            raise V2Error(v2.ILLEGAL_OFFSET, f"offset is {request.offset}; give one >= 0")
        await consumers.commit_offset(
            pb.CommitConsumerOffsetRequest(
                consumer_group=group,
                topic=topic,
                broker_name=broker,
                queue_id=queue_id,
                offset=request.offset,
            )
        )
    except Exception as exc:
        return v2s.UpdateOffsetResponse(status=status_of(exc, v2.TOPIC_NOT_FOUND))
    return v2s.UpdateOffsetResponse(status=OK)


async def get_offset(consumers: Consumers, request: v2s.GetOffsetRequest) -> v2s.GetOffsetResponse:
    try:
        group = group_of(request.group)
        topic, broker, queue_id = _queue(request.message_queue)
        found = await consumers.get_offset(
            pb.GetConsumerOffsetRequest(
                consumer_group=group, topic=topic, broker_name=broker, queue_id=queue_id
            )
        )
    except Exception as exc:
        return v2s.GetOffsetResponse(status=status_of(exc, v2.TOPIC_NOT_FOUND))
    if found.offset < 0:
        return v2s.GetOffsetResponse(
            status=status(v2.OFFSET_NOT_FOUND, f"group {group} has no offset for this queue")
        )
    return v2s.GetOffsetResponse(status=OK, offset=found.offset)


async def query_offset(
    consumers: Consumers, request: v2s.QueryOffsetRequest
) -> v2s.QueryOffsetResponse:
    try:
        topic, broker, queue_id = _queue(request.message_queue)
        policy = request.query_offset_policy
        if policy == v2.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise V2Error(v2.BAD_REQUEST, "query_offset_policy TIMESTAMP needs timestamp")
            searched = await consumers.search_offset(
                pb.SearchQueueOffsetRequest(
                    topic=topic,
                    broker_name=broker,
                    queue_id=queue_id,
                    timestamp_ms=max(timestamp_ms(request.timestamp), 0),
                )
            )
            return v2s.QueryOffsetResponse(status=OK, offset=searched.offset)
        offsets = await consumers.queue_offsets(
            pb.QueueOffsetsRequest(topic=topic, broker_name=broker, queue_id=queue_id)
        )
    except Exception as exc:
        return v2s.QueryOffsetResponse(status=status_of(exc, v2.TOPIC_NOT_FOUND))
    offset = offsets.min_offset if policy == v2.BEGINNING else offsets.max_offset
    return v2s.QueryOffsetResponse(status=OK, offset=offset)

"""Between the client's value types and the tide.v1 protobuf messages; client-side checks."""

from __future__ import annotations

from collections.abc import Sequence

from tide.client._errors import InvalidArgument, TideError
from tide.client._records import decode_pull_records
from tide.client._types import (
    Message,
    MessageQueue,
    PullResult,
    PullStatus,
    ReceivedMessage,
    SendResult,
    SendStatus,
)
from tide.limits import KEYS_MAX_COUNT
from tide.naming import consumer_group_error, tag_error, topic_error
from tide.v1 import gateway_pb2, storage_pb2

UNIQ_KEY = "UNIQ_KEY"
_FORBIDDEN_PROPERTY_CHARS = ("\x01", "\x02")

_SEND_STATUS = {
    gateway_pb2.ProduceResult.SEND_OK: SendStatus.SEND_OK,
    gateway_pb2.ProduceResult.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    gateway_pb2.ProduceResult.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    gateway_pb2.ProduceResult.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
    gateway_pb2.ProduceResult.SEND_FAILED: SendStatus.SEND_FAILED,
}
_PULL_STATUS = {
    gateway_pb2.PullResponse.FOUND: PullStatus.FOUND,
    gateway_pb2.PullResponse.NO_NEW_MESSAGE: PullStatus.NO_NEW_MESSAGE,
    gateway_pb2.PullResponse.NO_MATCHED_MESSAGE: PullStatus.NO_MATCHED_MESSAGE,
    gateway_pb2.PullResponse.OFFSET_ILLEGAL: PullStatus.OFFSET_ILLEGAL,
}


# Topic names found valid (a producer sends to a few topics, each checked on every send):
# a name's validity never changes, and the set is emptied when it holds this many.
_VALID_TOPICS_MAX = 1024
_valid_topics: set[str] = set()


def check_topic(topic: str) -> None:
    if type(topic) is str and topic in _valid_topics:
        return
    error = topic_error(topic)
    if error is not None:
        raise InvalidArgument(error)
    if type(topic) is str:
        if len(_valid_topics) >= _VALID_TOPICS_MAX:
            _valid_topics.clear()
        _valid_topics.add(topic)


def check_group(group: str) -> None:
    error = consumer_group_error(group)
    if error is not None:
        raise InvalidArgument(error)


def _check_delay(message: Message) -> None:
    """The gateway's static rules for the delay fields (the broker's table and timer
    maximum are the gateway's to check)."""
    given = {
        name: value
        for name, value in (
            ("delay_level", message.delay_level),
            ("deliver_at_ms", message.deliver_at_ms),
            ("delay_ms", message.delay_ms),
        )
        if value
    }
    if len(given) > 1:
        raise InvalidArgument(
            f"give one of delay_level, deliver_at_ms, delay_ms (got {', '.join(given)})"
        )
    for name, value in given.items():
        if type(value) is not int or value < 0:
            raise InvalidArgument(f"{name} is {value!r}; give an int > 0 (0: no delay)")
    if message.properties.get("TRAN_MSG") == "true":
        raise InvalidArgument("a transactional message (TRAN_MSG) cannot be delayed")


def plain_produce_message(topic: str, body: bytes | str) -> gateway_pb2.ProduceMessage:
    """A message of only a topic and a body, checked and built as ``to_produce_message``
    does ``Message(topic, body)`` (the same checks, errors and ProduceMessage), without
    the Message: the common blocking send's path."""
    check_topic(topic)
    if type(body) is not bytes:
        body = _body_bytes(body)
    return gateway_pb2.ProduceMessage(topic=topic, body=body)


def _body_bytes(body: object) -> bytes:
    data = body.encode("utf-8") if isinstance(body, str) else body
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidArgument(f"body is a {type(data).__name__}; give bytes or str")
    return bytes(data)


def to_produce_message(message: Message) -> gateway_pb2.ProduceMessage:
    """Check ``message`` and build its ProduceMessage (raises InvalidArgument)."""
    check_topic(message.topic)
    body = _body_bytes(message.body)
    if isinstance(message.keys, str):
        raise InvalidArgument("keys is a str; give a sequence of keys, e.g. ['order-1']")
    if len(message.keys) > KEYS_MAX_COUNT:  # the gateway's rule: every key is indexed
        raise InvalidArgument(f"{len(message.keys)} keys; at most {KEYS_MAX_COUNT} a message")
    error = tag_error(message.tags) if message.tags else None  # the gateway's rule
    if error is not None:
        raise InvalidArgument(error)
    for key in message.keys:
        if not key or " " in key:
            raise InvalidArgument(f"key {key!r} is empty or contains a space")
    for name, value in message.properties.items():
        if not name or any(c in name or c in value for c in _FORBIDDEN_PROPERTY_CHARS):
            raise InvalidArgument(f"property {name!r} is empty or contains \\x01 or \\x02")
    if message.sharding_key is not None and message.queue is not None:
        raise InvalidArgument("give sharding_key or queue, not both")
    delays = (message.delay_level, message.deliver_at_ms, message.delay_ms)
    if any(delays):
        _check_delay(message)
    # only the fields given: upb's constructor costs ~1 us a send more for empty ones
    proto = gateway_pb2.ProduceMessage(topic=message.topic, body=body)
    if message.tags:
        proto.tags = message.tags
    if message.keys:
        proto.keys.extend(message.keys)
    if message.properties:
        proto.properties.update(message.properties)
    if message.unique_key:
        proto.unique_key = message.unique_key
    if message.sharding_key is not None:
        proto.sharding_key = message.sharding_key
    if message.queue is not None:
        if message.queue.topic != message.topic:
            raise InvalidArgument(
                f"queue {message.queue} is of topic {message.queue.topic!r}, not {message.topic!r}"
            )
        proto.queue.broker_name = message.queue.broker_name
        proto.queue.queue_id = message.queue.queue_id
    if any(delays):
        proto.delay_level = message.delay_level
        proto.deliver_at_ms = message.deliver_at_ms
        proto.delay_ms = message.delay_ms
    return proto


def from_produce_result(topic: str, result: gateway_pb2.ProduceResult) -> SendResult:
    return SendResult(
        status=_SEND_STATUS.get(result.status, SendStatus.SEND_FAILED),
        msg_id=result.msg_id,
        unique_key=result.unique_key,
        queue=MessageQueue(topic, result.broker_name, result.queue_id),
        queue_offset=result.queue_offset,
        store_timestamp_ms=result.store_timestamp_ms,
        error=result.error
        or (f"unknown produce status {result.status}" if result.status not in _SEND_STATUS else ""),
    )


def from_produce_runs(
    topics: Sequence[str], runs: Sequence[gateway_pb2.ProduceRun]
) -> list[SendResult]:
    """Each message's result from a compact response's runs (``topics``: the request's
    messages' topics). TideError when the runs do not cover the messages once, in order."""
    results: list[SendResult] = []
    # Each SendResult made as its dataclass __init__ makes it (the same fields in its
    # __dict__: equal, hashed and shown alike; tests/client/test_convert.py holds them to
    # it) without the frozen __init__'s object.__setattr__ a field: half the cost a
    # message, for every message a blocking send() waits on.
    new_result = object.__new__
    for run in runs:
        if run.first_index != len(results) or len(run.unique_keys) != run.count:
            raise TideError(
                f"the gateway's runs do not cover the {len(topics)} messages in order: a "
                f"run of {run.count} at {run.first_index} after {len(results)} results"
            )
        status = _SEND_STATUS.get(run.status, SendStatus.SEND_FAILED)
        error = run.error or (
            f"unknown produce status {run.status}" if run.status not in _SEND_STATUS else ""
        )
        written = run.status != gateway_pb2.ProduceResult.SEND_FAILED
        if written and len(run.physical_offsets) != run.count:
            raise TideError(f"the gateway's run at {run.first_index} lacks physical offsets")
        first = run.first_index
        if first + run.count > len(topics):
            raise TideError(f"the gateway's runs cover more than {len(topics)} messages")
        # a run's fields read once, and one MessageQueue per topic of the run (immutable,
        # shared): this loop runs for every message a blocking send() waits on
        prefix, offsets, broker, queue_id = (
            run.msg_id_prefix,
            run.physical_offsets,
            run.broker_name,
            run.queue_id,
        )
        first_offset, stored_ms = run.first_queue_offset, run.store_timestamp_ms
        queues: dict[str, MessageQueue] = {}
        for i, unique_key in enumerate(run.unique_keys):
            topic = topics[first + i]
            queue = queues.get(topic)
            if queue is None:
                queue = queues[topic] = MessageQueue(topic, broker, queue_id)
            result = new_result(SendResult)
            result.__dict__.update(
                status=status,
                msg_id=f"{prefix}{offsets[i]:016X}" if written else "",
                unique_key=unique_key,
                queue=queue,
                queue_offset=first_offset + i if written else 0,
                store_timestamp_ms=stored_ms,
                error=error,
            )
            results.append(result)
    if len(results) != len(topics):
        raise TideError(f"the gateway's runs cover {len(results)} of {len(topics)} messages")
    return results


def from_stored_message(broker_name: str, message: storage_pb2.StoredMessage) -> ReceivedMessage:
    return ReceivedMessage(
        queue=MessageQueue(message.topic, broker_name, message.queue_id),
        queue_offset=message.queue_offset,
        body=message.body,
        tags=message.tags,
        keys=tuple(message.keys),
        properties=dict(message.properties),
        msg_id=message.msg_id,
        unique_key=message.properties.get(UNIQ_KEY, ""),
        born_timestamp_ms=message.born_timestamp_ms,
        store_timestamp_ms=message.store_timestamp_ms,
        born_host=message.born_host,
        store_host=message.store_host,
        reconsume_times=message.reconsume_times,
        physical_offset=message.physical_offset,
        size_bytes=message.size,
    )


def from_pull_response(queue: MessageQueue, response: gateway_pb2.PullResponse) -> PullResult:
    """The pull's result, its messages from ``records`` (ENCODING_RECORDS) when the gateway
    sent records, else from ``messages`` (a gateway that ignores the encoding asked for)."""
    status = _PULL_STATUS.get(response.status)
    if status is None:
        raise TideError(f"the gateway answered a pull with unknown status {response.status}")
    if response.records or response.record_count:  # asked for ENCODING_RECORDS
        messages = decode_pull_records(queue.broker_name, response.records, response.record_count)
    else:
        messages = tuple(from_stored_message(queue.broker_name, m) for m in response.messages)
    return PullResult(
        status=status,
        messages=messages,
        next_offset=response.next_offset,
        min_offset=response.min_offset,
        max_offset=response.max_offset,
    )

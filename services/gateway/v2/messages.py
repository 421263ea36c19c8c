"""Messages between RocketMQ 5's ``apache.rocketmq.v2.Message`` and Tide's: one stored
message, two wire shapes, so a message keeps its id (the UNIQ_KEY), keys, tags and user
properties whichever API produced or consumes it.

* v2 -> ``tide.v1.ProduceMessage``: message_id -> unique_key (unchanged: the clients
  match answers by it), tag -> tags, keys -> keys, message_group -> sharding_key,
  delivery_timestamp -> deliver_at_ms, TRANSACTION -> a half with the topic as its
  producer group (RocketMQ 5's proxy registers producers by topic), a GZIP body stored
  inflated (bounded by the body limit).
* stored -> v2: the well-known properties become system properties; the rest are the
  user properties. The body digest is MD5 in upper-case hex and the encoding IDENTITY
  (the clients check both).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from services.gateway.v2.status import V2Error
from tide import format as fmt
from tide.format import (
    KEYS,
    SHARDING_KEY,
    TAGS,
    TIMER_DELIVER_MS,
    UNIQ_KEY,
    TopicMessageType,
    message_type_of,
)
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.v1 import storage_pb2 as storage_pb

# Stored properties that are the broker's bookkeeping or a system property of the v2
# message, not user properties.
HIDDEN_PROPERTIES = frozenset(
    {
        KEYS,
        TAGS,
        UNIQ_KEY,
        SHARDING_KEY,
        TIMER_DELIVER_MS,
        fmt.WAIT,
        fmt.DELAY,
        fmt.REAL_TOPIC,
        fmt.REAL_QID,
        fmt.TIMER_DELAY_SEC,
        fmt.TIMER_DELAY_MS,
        fmt.TIMER_OUT_MS,
        fmt.TIMER_ENQUEUE_MS,
        fmt.TIMER_DEQUEUE_MS,
        fmt.TIMER_ROLL_TIMES,
        fmt.TIMER_DEL_UNIQKEY,
        fmt.TIMER_DELAY_LEVEL,
        fmt.RETRY_TOPIC,
        fmt.RECONSUME_TIME,
        fmt.MAX_RECONSUME_TIMES,
        fmt.ORIGIN_MESSAGE_ID,
        fmt.DLQ_ORIGIN_TOPIC,
        fmt.DLQ_ORIGIN_MESSAGE_ID,
        fmt.CONSUME_START_TIME,
        fmt.TRAN_MSG,
        fmt.TRANSACTION_ID,
        fmt.PGROUP,
    }
)
# POP's bookkeeping on a redelivered message (POP_CK, POP_ORIGIN_QID, ...: RocketMQ's
# names), never a user's.
POP_PROPERTY_PREFIX = "POP_"
MESSAGE_TYPES: dict[TopicMessageType, v2.MessageType.ValueType] = {
    TopicMessageType.NORMAL: v2.NORMAL,
    TopicMessageType.FIFO: v2.FIFO,
    TopicMessageType.DELAY: v2.DELAY,
    TopicMessageType.TRANSACTION: v2.TRANSACTION,
}


def timestamp_ms(value: Timestamp) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


def to_timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_ms(value: Duration) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


def to_duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def body_of(message: v2.Message, max_body_bytes: int) -> bytes:
    """The body as stored: a GZIP one inflated, no larger than ``max_body_bytes``."""
    system = message.system_properties
    if system.body_encoding != v2.GZIP:
        return message.body
    inflater = zlib.decompressobj(wbits=31)
    try:
        body = inflater.decompress(message.body, max_body_bytes + 1)
    except zlib.error as exc:
        raise V2Error(v2.MESSAGE_CORRUPTED, f"the GZIP body does not inflate: {exc}") from exc
    if len(body) > max_body_bytes or inflater.unconsumed_tail:
        raise V2Error(
            v2.MESSAGE_BODY_TOO_LARGE,
            f"the body inflates to more than {max_body_bytes} bytes "
            "(the gateway's --max-message-body-bytes)",
        )
    return body


def v2_message(
    stored: storage_pb.StoredMessage,
    topic_type: TopicMessageType | None = None,
) -> v2.Message:
    """A stored message as the v2 clients receive it (receipt handle and delivery
    attempt are the caller's)."""
    properties: Mapping[str, str] = stored.properties
    system = v2.SystemProperties(
        message_id=properties.get(UNIQ_KEY) or stored.msg_id,
        body_digest=v2.Digest(type=v2.MD5, checksum=hashlib.md5(stored.body).hexdigest().upper()),
        body_encoding=v2.IDENTITY,
        message_type=MESSAGE_TYPES.get(topic_type or message_type_of(properties), v2.NORMAL),
        born_timestamp=to_timestamp(stored.born_timestamp_ms),
        born_host=stored.born_host,
        store_timestamp=to_timestamp(stored.store_timestamp_ms),
        store_host=stored.store_host,
        queue_id=stored.queue_id,
        queue_offset=stored.queue_offset,
    )
    tags = stored.tags or properties.get(TAGS, "")
    if tags:
        system.tag = tags
    keys = list(stored.keys) or properties.get(KEYS, "").split()
    system.keys.extend(keys)
    group = properties.get(SHARDING_KEY)
    if group:
        system.message_group = group
    deliver_ms = properties.get(TIMER_DELIVER_MS, "")
    if deliver_ms.isdigit():
        system.delivery_timestamp.CopyFrom(to_timestamp(int(deliver_ms)))
    return v2.Message(
        topic=v2.Resource(name=stored.topic),
        user_properties={
            k: v
            for k, v in properties.items()
            if k not in HIDDEN_PROPERTIES and not k.startswith(POP_PROPERTY_PREFIX)
        },
        system_properties=system,
        body=stored.body,
    )

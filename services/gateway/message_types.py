"""Produce checks of topic kinds, where RocketMQ 5's proxy makes them.

* A system topic (schedule, timer, transaction, ``rmq_sys_*``), a retry or a
  dead-letter topic is written by the broker only: an ordinary producer is refused with
  what to do instead (tide.format.produce_topic_error). The gateway's own writers
  (send-back, the delay rewrite) and the dispatch's delivery services go around this.
* A message's type must be its topic's (``message.type``), unless the topic is MIXED
  (RocketMQ's ``DefaultTopicMessageTypeValidator``, on with
  ``--topic-message-type-check``). RocketMQ 5 answers a mismatch with
  ``MESSAGE_PROPERTY_CONFLICT_WITH_TYPE``, a bad-request code: INVALID_ARGUMENT here.
* A transactional message cannot also be delayed.

A message's type: TRANSACTION, DELAY, FIFO or NORMAL from its properties (tide.format
message_type_of), and DELAY when ``delay_level``, ``deliver_at_ms`` or ``delay_ms`` is
set. A message routed by a sharding key counts as FIFO on a FIFO topic and is also
taken by a NORMAL topic (Tide's sharding key chose queues before topics had types).

Cost: per request, one look per topic; per message only for a request where some
message has properties or a delay field (validate.ProduceCheck.typed, found on the way
by the request's checks), four field reads, and the properties looked at only when the
message has some.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.gateway.validate import invalid
from tide.format import (
    DELAYED_TRANSACTION_ERROR,
    TopicMessageType,
    delay_conflict_error,
    message_type_error,
    message_type_of,
    produce_topic_error,
)
from tide.quoting import quote
from tide.v1 import gateway_pb2 as pb

NORMAL = TopicMessageType.NORMAL
FIFO = TopicMessageType.FIFO
DELAY = TopicMessageType.DELAY
MIXED = TopicMessageType.MIXED
TRANSACTION = TopicMessageType.TRANSACTION


def check_produce_topics(messages: Sequence[pb.ProduceMessage], topics: set[str]) -> None:
    """Refuse a produce to a topic only the broker writes (INVALID_ARGUMENT naming the
    first such message)."""
    for topic in topics:
        error = produce_topic_error(topic)
        if error is not None:
            index = next(i for i, message in enumerate(messages) if message.topic == topic)
            raise invalid(f"messages[{index}].topic: {error}")


def check_message_types(
    messages: Sequence[pb.ProduceMessage],
    topic_types: Mapping[str, TopicMessageType],
    *,
    typed: bool,
    type_check: bool,
) -> None:
    """Each message's type against its topic's (``type_check``), and the delay and
    transaction conflict (always). ``typed``: some message has properties or a delay
    field (validate.ProduceCheck); without, every message is NORMAL and the check is one
    look per topic. Else a NORMAL message costs one look at those four fields, and a
    topic look only when some topic of the request refuses NORMAL messages."""
    # Topics that refuse a NORMAL message (all but NORMAL and MIXED ones).
    strict = type_check and any(t is not NORMAL and t is not MIXED for t in topic_types.values())
    if not typed:  # every message is NORMAL
        if not strict:
            return
        if FIFO not in topic_types.values():  # else: sharding keys, message by message
            for topic, topic_type in topic_types.items():
                if topic_type is not NORMAL and topic_type is not MIXED:
                    _refuse(messages, topic, topic_type, NORMAL)
    for index, message in enumerate(messages):
        if (
            message.properties
            or message.delay_level
            or message.deliver_at_ms
            or message.delay_ms
            or message.transactional
        ):
            message_type = _typed(index, message)
        elif not strict:
            continue
        else:
            message_type = NORMAL
        if not type_check:
            continue
        topic_type = topic_types[message.topic]
        if message_type is topic_type or topic_type is MIXED:
            continue
        if message_type is NORMAL and topic_type is FIFO:
            if message.sharding_key:
                continue  # a sharding key is the FIFO topic's message group
            raise invalid(f"messages[{index}]: {fifo_group_error(message.topic)}")
        _refuse(messages, message.topic, topic_type, message_type, index)


def fifo_group_error(topic: str) -> str:
    """Why a message without a message group may not go to FIFO ``topic``."""
    return (
        f"topic {quote(topic)} is FIFO and this message has no message group: give it "
        "one (sharding_key; Producer.send(sharding_key=...), tide produce --sharding-key)"
    )


def _typed(index: int, message: pb.ProduceMessage) -> TopicMessageType:
    """The type of a message with properties or a delay field; refuses a delayed
    transactional message."""
    delayed = bool(message.delay_level or message.deliver_at_ms or message.delay_ms)
    if message.transactional:  # a half message (transactions.py)
        if delayed:
            raise invalid(f"messages[{index}]: {DELAYED_TRANSACTION_ERROR}")
        return TRANSACTION
    properties = message.properties
    if not properties:
        return DELAY if delayed else NORMAL
    message_type = message_type_of(properties)
    if message_type is TRANSACTION:
        error = DELAYED_TRANSACTION_ERROR if delayed else delay_conflict_error(properties)
        if error is not None:
            raise invalid(f"messages[{index}]: {error}")
        return message_type
    return DELAY if delayed else message_type


def _refuse(
    messages: Sequence[pb.ProduceMessage],
    topic: str,
    topic_type: TopicMessageType,
    message_type: TopicMessageType,
    index: int | None = None,
) -> None:
    if index is None:
        index = next(i for i, message in enumerate(messages) if message.topic == topic)
    error = message_type_error(topic, topic_type, message_type)
    raise invalid(f"messages[{index}]: {error} (or turn --topic-message-type-check off)")

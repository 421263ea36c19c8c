"""A topic's message type: RocketMQ 5's ``message.type`` topic attribute.

docs/formats.md, "Message types". Stored in ``topics.json`` as the topic's
``"attributes": {"message.type": "DELAY"}`` (no attribute means NORMAL). A message's own
type follows from its properties (``TopicMessageType.parseFromMessageProperty``), and a
producer's message must match its topic's type unless the topic is MIXED
(``DefaultTopicMessageTypeValidator``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from tide.format._properties import (
    DELAY,
    SHARDING_KEY,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TRAN_MSG,
)

TOPIC_MESSAGE_TYPE_ATTRIBUTE = "message.type"  # TopicAttributes.TOPIC_MESSAGE_TYPE_ATTRIBUTE
_DELAY_PROPERTIES = (DELAY, TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS)
_SHOWN_CHARS = 40


class TopicMessageType(enum.Enum):
    UNSPECIFIED = "UNSPECIFIED"
    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"


def topic_message_type(attributes: Mapping[str, str]) -> TopicMessageType:
    """The type a topic's attributes give it (NORMAL without the attribute); ValueError
    for a value that is not a type."""
    value = attributes.get(TOPIC_MESSAGE_TYPE_ATTRIBUTE)
    if value is None:
        return TopicMessageType.NORMAL
    if value not in TopicMessageType.__members__:
        raise ValueError(
            f"{TOPIC_MESSAGE_TYPE_ATTRIBUTE} is {value[:_SHOWN_CHARS]!r}; it must be one of "
            f"{', '.join(TopicMessageType.__members__)}"
        )
    return TopicMessageType(value)


def message_type_of(properties: Mapping[str, str]) -> TopicMessageType:
    """A message's type from its properties: a transaction half message, then a delay
    level or timer, then a sharding key (FIFO), else NORMAL."""
    if properties.get(TRAN_MSG) == "true":
        return TopicMessageType.TRANSACTION
    if any(name in properties for name in _DELAY_PROPERTIES):
        return TopicMessageType.DELAY
    if SHARDING_KEY in properties:
        return TopicMessageType.FIFO
    return TopicMessageType.NORMAL


def message_type_error(
    topic: str, topic_type: TopicMessageType, message_type: TopicMessageType
) -> str | None:
    """Why a message of ``message_type`` may not go to a topic of ``topic_type``, or None."""
    if message_type is TopicMessageType.UNSPECIFIED or (
        message_type is not topic_type and topic_type is not TopicMessageType.MIXED
    ):
        shown = topic if len(topic) <= _SHOWN_CHARS else topic[:_SHOWN_CHARS] + "..."
        return (
            f"topic {shown!r} takes {topic_type.value} messages, and this message is "
            f"{message_type.value}; send it to a topic of that type (or MIXED)"
        )
    return None


DELAYED_TRANSACTION_ERROR = (
    "a transactional message cannot be delayed; drop delay_level / deliver_at_ms / delay_ms, "
    "or send it as an ordinary message"
)
"""The one refusal of a delayed transactional message, whichever way the delay came."""


def delay_conflict_error(properties: Mapping[str, str]) -> str | None:
    """A transactional message cannot also be delayed (RocketMQ delays only messages of
    transaction type *not* or *commit*)."""
    if properties.get(TRAN_MSG) == "true" and any(n in properties for n in _DELAY_PROPERTIES):
        return DELAYED_TRANSACTION_ERROR
    return None

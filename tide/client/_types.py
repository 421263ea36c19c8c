"""The client's value types: queues, messages to send, results, received messages."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# tide.format's names, repeated so the value types import nothing else.
RETRY_TOPIC_PREFIX = "%RETRY%"
RETRY_TOPIC_PROPERTY = "RETRY_TOPIC"


@dataclass(frozen=True, order=True)
class MessageQueue:
    """One queue of a topic: (topic, broker name, queue id). Sorts in that order."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"


@dataclass(frozen=True)
class Message:
    """A message to send. ``sharding_key`` and ``queue`` are exclusive: messages with the same
    sharding key go to the same queue (while the route does not change); ``queue`` names
    one queue exactly (never retried on another broker).

    Deliver later (docs/delivery.md), at most one of: ``delay_level`` (1..the broker's
    table, 18 by default: 1s 5s 10s 30s 1m ... 2h), ``deliver_at_ms`` (ms since epoch; a
    time in the past delivers now) or ``delay_ms``; 0 is no delay. The send result of such
    a message names the stored (scheduled) copy: consumers see the delivered one, with the
    same ``unique_key``."""

    topic: str
    body: bytes | str
    tags: str = ""
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    sharding_key: str | None = None
    queue: MessageQueue | None = None
    delay_level: int = 0
    deliver_at_ms: int = 0
    delay_ms: int = 0
    # The UNIQ_KEY to store (RocketMQ's client message id); empty: the gateway makes one.
    # A resent dead letter keeps its own, so consumers see the same message again.
    unique_key: str = ""


class SendStatus(enum.Enum):
    """The outcome of one sent message; every status but SEND_FAILED means written."""

    SEND_OK = "SEND_OK"
    # Written, but the SYNC_FLUSH did not confirm within the flush timeout.
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    # Written, but no slave acknowledged within the timeout.
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    # Written, but no slave is available.
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    # Not written (only in a batch where other messages were written); see ``error``.
    SEND_FAILED = "SEND_FAILED"


@dataclass(frozen=True)
class SendResult:
    status: SendStatus
    # Offset message id (store host + commitlog offset): ``query id`` finds it directly.
    msg_id: str
    # The UNIQ_KEY property (client message id).
    unique_key: str
    queue: MessageQueue
    queue_offset: int
    store_timestamp_ms: int
    error: str = ""

    @property
    def written(self) -> bool:
        return self.status is not SendStatus.SEND_FAILED


@dataclass(frozen=True)
class ReceivedMessage:
    """A stored message as a consumer sees it."""

    queue: MessageQueue
    queue_offset: int
    body: bytes
    tags: str
    keys: tuple[str, ...]
    # Every property as stored, including TAGS, KEYS and UNIQ_KEY.
    properties: Mapping[str, str]
    msg_id: str
    unique_key: str
    born_timestamp_ms: int
    store_timestamp_ms: int
    born_host: str
    store_host: str
    reconsume_times: int
    physical_offset: int
    size_bytes: int

    @property
    def topic(self) -> str:
        """The topic the message was produced to. A redelivery comes from the group's
        retry topic (``queue.topic`` is ``%RETRY%<group>``): this is its original topic,
        kept in the RETRY_TOPIC property."""
        topic = self.queue.topic
        if topic.startswith(RETRY_TOPIC_PREFIX):
            return self.properties.get(RETRY_TOPIC_PROPERTY, topic)
        return topic

    @property
    def attempt(self) -> int:
        """The delivery attempt: 1 the first time, 2 after one send-back, ... (RocketMQ
        5's delivery attempt; ``reconsume_times`` counts the send-backs before it)."""
        return self.reconsume_times + 1


class ConsumeResult(enum.Enum):
    """What a push consumer's callback returns (None means SUCCESS; raising means
    RECONSUME_LATER): RocketMQ's ConsumeConcurrentlyStatus."""

    SUCCESS = "SUCCESS"
    # Deliver it again later: the message is sent back to the broker (the group's retry
    # policy says when), or to the dead-letter queue after the group's maximum.
    RECONSUME_LATER = "RECONSUME_LATER"


@dataclass(frozen=True)
class SendBackResult:
    """Where a sent-back message went."""

    # %RETRY%<group>, or %DLQ%<group> once dead-lettered.
    topic: str
    dead_lettered: bool
    # The attempt the redelivery will be counted as (its reconsume times).
    reconsume_times: int
    # When it is due again (ms since epoch; 0 for a dead letter).
    deliver_at_ms: int
    # The stored copy's msg id.
    msg_id: str


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    # offset == max offset: nothing new (after the long poll, if any).
    NO_NEW_MESSAGE = "NO_NEW_MESSAGE"
    # Messages were looked at but none matched the expression; next_offset moves past them.
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    # offset < min offset or > max offset; next_offset is the nearest valid offset.
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(frozen=True)
class PullResult:
    status: PullStatus
    messages: tuple[ReceivedMessage, ...]
    # Where the next pull starts.
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class QueueOffsets:
    """A queue's first stored offset and the offset the next message will get."""

    min_offset: int
    max_offset: int

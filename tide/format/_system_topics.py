"""System topic names: retry, dead-letter, schedule, timer and transaction topics.

docs/formats.md, "System topics". The names are RocketMQ's (``MixAll``, ``TopicValidator``,
``TimerMessageStore.TIMER_TOPIC``) because they are stored in every record and consume
queue directory of the topics they name.

Three notions, kept apart on purpose:

* :func:`is_system_topic` is RocketMQ's ``TopicValidator.isSystemTopic``: a fixed set plus
  every topic starting ``rmq_sys_`` (the timer topic among them). ``%RETRY%`` and ``%DLQ%``
  topics are *not* system topics there.
* :func:`is_hidden_topic`: system, retry and dead-letter topics, which topic listings
  leave out unless asked for.
* :func:`produce_topic_error`: why an ordinary client may not produce to a topic (the
  schedule, timer and transaction topics are written by the broker only; retry topics
  by consumer send-back; dead-letter topics by the broker and resends).
"""

from __future__ import annotations

RETRY_TOPIC_PREFIX = "%RETRY%"  # MixAll.RETRY_GROUP_TOPIC_PREFIX
DLQ_TOPIC_PREFIX = "%DLQ%"  # MixAll.DLQ_GROUP_TOPIC_PREFIX
SYSTEM_TOPIC_PREFIX = "rmq_sys_"  # TopicValidator.SYSTEM_TOPIC_PREFIX
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # TopicValidator.RMQ_SYS_SCHEDULE_TOPIC
TIMER_TOPIC = SYSTEM_TOPIC_PREFIX + "wheel_timer"  # TimerMessageStore.TIMER_TOPIC
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
SCHEDULE_CONSUMER_GROUP = "SCHEDULE_CONSUMER"  # MixAll: the group the schedule service reads as
# POP (issue 20): checkpoints and acks (RocketMQ's rmq_sys_REVIVE_LOG_<cluster>; one store
# is one broker here, so no cluster suffix), one queue: an ack follows its checkpoint.
REVIVE_TOPIC = SYSTEM_TOPIC_PREFIX + "REVIVE_LOG"
REVIVE_QUEUE_ID = 0
# The revive service's progress is this group's offset of the revive queue (RocketMQ's
# PopAckConstants.REVIVE_GROUP), in the storage's offset table: slaves hold it too.
REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"
POP_RETRY_QUEUE_NUMS = 1  # a POP retry topic's queues

RETRY_OR_DLQ_TOPIC_MAX_CHARS = 255
"""Longest ``%RETRY%<group>`` / ``%DLQ%<group>`` (TopicValidator.RETRY_OR_DLQ_TOPIC_MAX_LENGTH).

Such topics may exceed the 127 bytes of a v1 record's topic; RocketMQ stores them with the
v2 magic (2-byte topic length)."""
DLQ_QUEUE_NUMS = 1  # AbstractSendMessageProcessor.DLQ_NUMS_PER_GROUP

# TopicValidator.SYSTEM_TOPIC_SET (without the benchmark and trace topics, which Tide does
# not reserve: they are ordinary topics a user may create).
_SYSTEM_TOPICS = frozenset(
    {
        AUTO_CREATE_TOPIC_KEY_TOPIC,
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "CHECKPOINT_TOPIC",
    }
)
# What each broker-written topic is for, to say what to do instead of producing to it.
_BROKER_ONLY = {
    SCHEDULE_TOPIC: "set delay_level on a message to its real topic instead",
    TRANS_HALF_TOPIC: "send a transactional message to its real topic instead",
    TRANS_OP_HALF_TOPIC: "commit or roll back the transaction instead",
    TRANS_CHECK_MAX_TIME_TOPIC: "it holds transactions past their last check",
}
_SHOWN_CHARS = 40  # how much of a name an error message repeats


def is_system_topic(topic: str) -> bool:
    """RocketMQ's ``TopicValidator.isSystemTopic``."""
    return topic in _SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_TOPIC_PREFIX)


def is_hidden_topic(topic: str) -> bool:
    """Left out of topic listings (and the Spark source) unless asked for."""
    return is_system_topic(topic) or is_retry_topic(topic) or is_dlq_topic(topic)


def retry_topic(group: str) -> str:
    """``%RETRY%<group>``; ValueError past :data:`RETRY_OR_DLQ_TOPIC_MAX_CHARS`."""
    return _group_topic(RETRY_TOPIC_PREFIX, group)


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>``; ValueError past :data:`RETRY_OR_DLQ_TOPIC_MAX_CHARS`."""
    return _group_topic(DLQ_TOPIC_PREFIX, group)


def pop_retry_topic(group: str, topic: str) -> str:
    """The group's POP retry topic of ``topic``: ``%RETRY%<group>_<topic>`` (RocketMQ 5's
    KeyBuilder.buildPopRetryTopicV1). ValueError past the topic name limit (127 bytes)."""
    name = f"{RETRY_TOPIC_PREFIX}{group}_{topic}"
    if len(name.encode("utf-8")) > 127:
        raise ValueError(
            f"the POP retry topic of group {_show(group)} and topic {_show(topic)} would be "
            f"{len(name)} characters; POP needs group and topic names of at most 119 together"
        )
    return name


def group_of_retry_topic(topic: str) -> str | None:
    """The consumer group of ``%RETRY%<group>``, or None for any other topic."""
    return _group_of(RETRY_TOPIC_PREFIX, topic)


def group_of_dlq_topic(topic: str) -> str | None:
    """The consumer group of ``%DLQ%<group>``, or None for any other topic."""
    return _group_of(DLQ_TOPIC_PREFIX, topic)


def group_topic_error(group: str) -> str | None:
    """Why ``group`` cannot have retry and dead-letter topics, or None when it can.

    The group's own charset is checked by ``tide.naming``; this is the length its longer
    derived name (``%RETRY%<group>``) leaves it.
    """
    limit = RETRY_OR_DLQ_TOPIC_MAX_CHARS - len(RETRY_TOPIC_PREFIX)
    if not group:
        return "consumer group is empty; retry and dead-letter topics need a group name"
    if len(group) > limit:
        return (
            f"consumer group {_show(group)} is {len(group)} characters; its retry topic "
            f"{RETRY_TOPIC_PREFIX}<group> would pass {RETRY_OR_DLQ_TOPIC_MAX_CHARS} "
            f"characters, so groups with retries are limited to {limit}"
        )
    return None


def produce_topic_error(topic: str) -> str | None:
    """Why an ordinary client may not produce to ``topic``, or None when it may."""
    if topic in _BROKER_ONLY:
        return f"topic {topic} is written by the broker only; {_BROKER_ONLY[topic]}"
    if topic.startswith(SYSTEM_TOPIC_PREFIX):
        return (
            f"topic {_show(topic)} is a system topic ({SYSTEM_TOPIC_PREFIX}*) written by the "
            "broker only; for a timed message set deliver_at_ms on its real topic"
        )
    if is_retry_topic(topic):
        return (
            f"topic {_show(topic)} is a retry topic; report a failed message with consumer "
            "send-back instead of producing to it"
        )
    if is_dlq_topic(topic):
        return (
            f"topic {_show(topic)} is a dead-letter topic; resend dead letters to their "
            "original topic with `tide dlq resend` instead"
        )
    if is_system_topic(topic):
        return f"topic {_show(topic)} is reserved by the broker"
    return None


def _group_topic(prefix: str, group: str) -> str:
    error = group_topic_error(group)
    if error is not None:
        raise ValueError(error)
    return prefix + group


def _group_of(prefix: str, topic: str) -> str | None:
    if topic.startswith(prefix) and len(topic) > len(prefix):
        return topic[len(prefix) :]
    return None


def _show(name: str) -> str:
    return repr(name) if len(name) <= _SHOWN_CHARS else f"{name[:_SHOWN_CHARS]!r}..."

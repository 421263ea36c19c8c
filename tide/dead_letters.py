"""A consumer group's dead letters (``%DLQ%<group>``): where one came from and the message
that sends it again. Shared by ``tide dlq`` and the console's dead-letters page.

A dead-letter queue is write-only for consumers: both read it with BrowseQueue, which
commits nothing. A resend produces the dead letter again to the topic it was first
produced to (DLQ_ORIGIN_TOPIC, else RETRY_TOPIC) with its body, tags, keys, user
properties and UNIQ_KEY (docs/delivery.md, "Retries and dead letters").
"""

from __future__ import annotations

from collections.abc import Iterator

from tide.client import Admin, Message, MessageQueue, PullStatus, ReceivedMessage, TopicNotFound

DLQ_PREFIX = "%DLQ%"
RETRY_PREFIX = "%RETRY%"
BROWSE_BATCH = 32
# Properties the broker or the gateway writes, not carried over by a resend (the
# message's own tags, keys and UNIQ_KEY are passed as such).
SYSTEM_PROPERTIES = frozenset(
    {
        "TAGS",
        "KEYS",
        "UNIQ_KEY",
        "DLQ_ORIGIN_TOPIC",
        "DLQ_ORIGIN_MESSAGE_ID",
        "RETRY_TOPIC",
        "ORIGIN_MESSAGE_ID",
        "ORIGIN_STORE_TIME",
        "RECONSUME_TIME",
        "MAX_RECONSUME_TIMES",
        "DELAY",
        "REAL_TOPIC",
        "REAL_QID",
        "TIMER_DELIVER_MS",
        "TIMER_OUT_MS",
        "CONSUME_START_TIME",
        "WAIT",
    }
)


def original_topic(message: ReceivedMessage) -> str:
    """The topic a dead letter was first produced to ("" when it names none)."""
    props = message.properties
    return props.get("DLQ_ORIGIN_TOPIC") or props.get("RETRY_TOPIC") or ""


def dlq_queues(admin: Admin, group: str) -> list[MessageQueue]:
    """The queues of ``%DLQ%<group>`` (every queue: a dead-letter queue is not readable
    by consumers); none when the group never had a dead letter."""
    topic = DLQ_PREFIX + group
    try:
        route = admin.route(topic)
    except TopicNotFound:
        return []
    return sorted(
        MessageQueue(topic, data.broker_name, queue_id)
        for data in route.queue_datas
        for queue_id in range(max(data.read_queue_nums, data.write_queue_nums))
    )


def dead_letters(admin: Admin, group: str, limit: int) -> Iterator[ReceivedMessage]:
    """The group's dead letters, oldest first per queue, at most ``limit``."""
    count = 0
    for queue in dlq_queues(admin, group):
        offset = 0
        while count < limit:
            result = admin.browse_queue(queue, offset, BROWSE_BATCH)
            for message in result.messages[: limit - count]:
                yield message
                count += 1
            if result.status is PullStatus.NO_NEW_MESSAGE or result.next_offset <= offset:
                break
            offset = result.next_offset


def resent_message(message: ReceivedMessage, topic: str) -> Message:
    """The message that produces dead letter ``message`` again to ``topic``: its body,
    tags, keys, user properties and UNIQ_KEY (consumers see the same message again)."""
    user = {k: v for k, v in message.properties.items() if k not in SYSTEM_PROPERTIES}
    return Message(
        topic,
        message.body,
        tags=message.tags,
        keys=message.keys,
        properties=user,
        unique_key=message.unique_key,
    )

"""What a sent-back message becomes: the pure half of SendBack (send_back.py).

RocketMQ's ``SendMessageProcessor.consumerSendMsgBack``: the message read back from the
store is copied, its reconsume times + 1, into ``%RETRY%<group>`` (delayed by the
group's retry policy) or, once it was reconsumed the group's maximum times (or the
consumer asked with delay level -1), into ``%DLQ%<group>`` queue 0.

* the retry copy keeps the body, flag, tags, keys, user properties, UNIQ_KEY and born
  time; RETRY_TOPIC and ORIGIN_MESSAGE_ID name the first attempt's topic and msg id (kept
  from the first attempt on every later one), ORIGIN_STORE_TIME its store time;
  RECONSUME_TIME and MAX_RECONSUME_TIMES the attempt and the maximum;
* a delay level (the default policy, RocketMQ 4's level 3 + reconsume times, or one the
  consumer asked for) stores it in SCHEDULE_TOPIC_XXXX as any delayed message (DELAY,
  REAL_TOPIC, REAL_QID); an EXPONENTIAL policy or a custom list files it with the timer
  (rmq_sys_wheel_timer, TIMER_DELIVER_MS / TIMER_OUT_MS, REAL_TOPIC, REAL_QID);
* the dead letter adds DLQ_ORIGIN_TOPIC and DLQ_ORIGIN_MESSAGE_ID.
"""

from __future__ import annotations

from dataclasses import dataclass

from tide.format import (
    DLQ_ORIGIN_MESSAGE_ID,
    DLQ_ORIGIN_TOPIC,
    KEYS,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    RECONSUME_TIME,
    RETRY_TOPIC,
    SCHEDULE_BOOKKEEPING,
    SCHEDULE_TOPIC,
    TAGS,
    TIMER_TOPIC,
    DelayLevelTable,
    GroupRetryPolicy,
    RetryPolicyType,
    delay_level_properties,
    retry_delay_level,
    schedule_queue_id,
    timer_properties,
)
from tide.v1 import storage_pb2 as storage_pb

ORIGIN_STORE_TIME = "ORIGIN_STORE_TIME"
"""Tide's property: the first attempt's store time (ms), kept on every retry and dead
letter so an operator sees when the message was first written (RocketMQ keeps only the
born time)."""
# sys_flag bits a producer may set (the store owns the host bits): storage's
# PRODUCER_SYSFLAG_MASK, the bits a copy keeps.
_PRODUCER_SYSFLAG_MASK = 0b111_0000_1111
TIMER_QUEUE_ID = 0  # the timer topic has one queue


@dataclass(frozen=True, slots=True)
class Delay:
    """How long the retry copy waits: a delay level, or a delivery time for the timer."""

    level: int = 0
    deliver_at_ms: int = 0


def retry_delay(
    policy: GroupRetryPolicy,
    table: DelayLevelTable,
    reconsume_times: int,
    requested_level: int,
    now_ms: int,
) -> Delay:
    """The wait before the next attempt of a message reconsumed ``reconsume_times``
    times: the level the consumer asked for (clamped to the table, as RocketMQ's
    putMessage clamps), else the group's policy (decision 6 of the issue's design: the
    default CUSTOMIZED policy without a list is RocketMQ 4's level 3 + reconsume times;
    EXPONENTIAL or a custom list goes through the timer)."""
    if requested_level > 0:
        return Delay(level=min(requested_level, table.max_level))
    if policy.type is RetryPolicyType.CUSTOMIZED and policy.customized is None:
        return Delay(level=retry_delay_level(table, reconsume_times))
    return Delay(deliver_at_ms=now_ms + policy.next_delay_ms(reconsume_times))


def user_properties(stored: storage_pb.StoredMessage) -> dict[str, str]:
    """The stored properties without TAGS and KEYS (the copy carries them as fields, the
    store writes them back) nor a previous delay's bookkeeping."""
    return {
        name: value
        for name, value in stored.properties.items()
        if name not in SCHEDULE_BOOKKEEPING and name not in (TAGS, KEYS)
    }


def original_topic(stored: storage_pb.StoredMessage) -> str:
    """The topic the message was first produced to (kept in RETRY_TOPIC once retried)."""
    return stored.properties.get(RETRY_TOPIC) or stored.topic


def retry_copy(
    stored: storage_pb.StoredMessage,
    retry_topic: str,
    queue_id: int,
    max_reconsume_times: int,
    delay: Delay,
    now_ms: int,
    timer_precision_ms: int,
) -> storage_pb.Message:
    """The copy stored for the next attempt, in the schedule or timer topic whose
    REAL_TOPIC / REAL_QID name ``retry_topic`` queue ``queue_id``."""
    reconsume_times = stored.reconsume_times + 1
    properties = _first_attempt(stored)
    properties[RECONSUME_TIME] = str(reconsume_times)
    properties[MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    if delay.level > 0:
        properties = delay_level_properties(properties, retry_topic, queue_id, delay.level)
        topic, queue = SCHEDULE_TOPIC, schedule_queue_id(delay.level)
    else:
        properties = timer_properties(
            properties, retry_topic, queue_id, delay.deliver_at_ms, now_ms, timer_precision_ms
        )
        topic, queue = TIMER_TOPIC, TIMER_QUEUE_ID
    return _copy(stored, topic, queue, properties, reconsume_times)


def dead_letter_copy(
    stored: storage_pb.StoredMessage, dlq_topic: str, max_reconsume_times: int
) -> storage_pb.Message:
    """The copy stored in ``%DLQ%<group>`` queue 0."""
    properties = _first_attempt(stored)
    properties[DLQ_ORIGIN_TOPIC] = properties[RETRY_TOPIC]
    properties[DLQ_ORIGIN_MESSAGE_ID] = properties[ORIGIN_MESSAGE_ID]
    properties[RECONSUME_TIME] = str(stored.reconsume_times + 1)
    properties[MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    return _copy(stored, dlq_topic, 0, properties, stored.reconsume_times + 1)


def _first_attempt(stored: storage_pb.StoredMessage) -> dict[str, str]:
    """The user properties with the first attempt's topic, msg id and store time."""
    properties = user_properties(stored)
    properties.setdefault(RETRY_TOPIC, stored.topic)
    properties.setdefault(ORIGIN_MESSAGE_ID, stored.msg_id)
    properties.setdefault(ORIGIN_STORE_TIME, str(stored.store_timestamp_ms))
    return properties


def _copy(
    stored: storage_pb.StoredMessage,
    topic: str,
    queue_id: int,
    properties: dict[str, str],
    reconsume_times: int,
) -> storage_pb.Message:
    return storage_pb.Message(
        topic=topic,
        queue_id=queue_id,
        body=stored.body,
        tags=stored.tags,
        keys=list(stored.keys),
        properties=properties,
        flag=stored.flag,
        born_timestamp_ms=stored.born_timestamp_ms,
        born_host=stored.born_host,
        sys_flag=stored.sys_flag & _PRODUCER_SYSFLAG_MASK,
        reconsume_times=reconsume_times,
    )

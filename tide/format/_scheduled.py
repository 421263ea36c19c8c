"""Scheduled messages: the property rewrites into and out of the schedule and timer topics.

docs/formats.md, "Scheduled message transforms". Pure functions shared by the gateway
(which stores a delayed message in ``SCHEDULE_TOPIC_XXXX`` or ``rmq_sys_wheel_timer``,
RocketMQ's ``HookUtils.transformDelayLevelMessage`` / ``transformTimerMessage``) and the
dispatch's delivery services (which turn a due message back into one for its real topic,
``ScheduleMessageService.messageTimeup`` / ``TimerMessageStore.convertMessage``).

A delivered copy is a plain message again: the bookkeeping below is removed, everything
else (``UNIQ_KEY``, keys, tags, user properties, send-back properties) is kept, so a
consumer sees one message and lookups by key or unique key find it.
"""

from __future__ import annotations

from collections.abc import Mapping

from tide.format._properties import (
    DELAY,
    REAL_QID,
    REAL_TOPIC,
    TIMER_DELAY_LEVEL,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TIMER_DEQUEUE_MS,
    TIMER_ENQUEUE_MS,
    TIMER_OUT_MS,
    TIMER_ROLL_TIMES,
)
from tide.format._timer_wheel import TimerWheelGeometry, timer_slot_time_ms
from tide.quoting import quote

SCHEDULE_BOOKKEEPING = frozenset(
    {
        DELAY,
        REAL_TOPIC,
        REAL_QID,
        TIMER_DELIVER_MS,
        TIMER_DELAY_SEC,
        TIMER_DELAY_MS,
        TIMER_OUT_MS,
        TIMER_ENQUEUE_MS,
        TIMER_DEQUEUE_MS,
        TIMER_ROLL_TIMES,
        TIMER_DELAY_LEVEL,
    }
)
"""Properties that say where and when a scheduled message goes; a delivered copy has none
of them (RocketMQ keeps some on the copy; Tide drops them so that resending a delivered
message, from a dead-letter queue for instance, does not delay it again)."""

_MAX_QUEUE_ID = 2**31 - 1


def _without_bookkeeping(properties: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in properties.items() if name not in SCHEDULE_BOOKKEEPING}


def delay_level_properties(
    properties: Mapping[str, str], real_topic: str, real_queue_id: int, level: int
) -> dict[str, str]:
    """The properties of a delay-level message as stored in ``SCHEDULE_TOPIC_XXXX``.

    The caller checks ``level`` against its table (``DelayLevelTable.level_error``) and
    stores the message in queue ``schedule_queue_id(level)``. Any bookkeeping the input
    already carries is replaced, so the stored bytes are the user's properties followed
    by ``DELAY``, ``REAL_TOPIC``, ``REAL_QID``.
    """
    if level < 1:
        raise ValueError(f"delay level {level}; levels start at 1")
    result = _without_bookkeeping(properties)
    result[DELAY] = str(level)
    result[REAL_TOPIC] = real_topic
    result[REAL_QID] = str(real_queue_id)
    return result


def timer_due_now(deliver_at_ms: int, now_ms: int) -> bool:
    """A timed message for ``deliver_at_ms`` goes straight to its real topic at ``now_ms``
    (``transformTimerMessage`` rewrites only a time still ahead)."""
    return deliver_at_ms <= now_ms


def timer_properties(
    properties: Mapping[str, str],
    real_topic: str,
    real_queue_id: int,
    deliver_at_ms: int,
    now_ms: int,
    precision_ms: int,
) -> dict[str, str]:
    """The properties of a timed message as stored in ``rmq_sys_wheel_timer`` queue 0.

    ``TIMER_DELIVER_MS`` is the asked time, ``TIMER_OUT_MS`` the wheel slot it is filed
    under (``timer_slot_time_ms``: a message never fires early). A time at or before
    ``now_ms`` is delivered now: the result is the plain message for the real topic, with
    no ``REAL_TOPIC`` (:func:`timer_due_now` says which case applies). The maximum delay
    is the caller's check (``timer_deliver_error``); ValueError for a precision that is
    not 100, 200, 500 or 1000 ms.
    """
    geometry = TimerWheelGeometry(precision_ms=precision_ms)
    result = _without_bookkeeping(properties)
    if timer_due_now(deliver_at_ms, now_ms):
        return result
    result[TIMER_DELIVER_MS] = str(deliver_at_ms)
    result[TIMER_OUT_MS] = str(timer_slot_time_ms(geometry, deliver_at_ms))
    result[REAL_TOPIC] = real_topic
    result[REAL_QID] = str(real_queue_id)
    return result


def real_destination(
    topic: str, queue_id: int, properties: Mapping[str, str]
) -> tuple[str, int, dict[str, str]]:
    """What a due message of ``topic`` / ``queue_id`` becomes: its real topic, real queue
    and properties without the scheduling bookkeeping.

    ValueError (the text names the stored topic and queue) when ``REAL_TOPIC`` is missing
    or empty, or ``REAL_QID`` is not a queue id: such a record cannot be delivered, and no
    retry will change that.
    """
    real_topic = properties.get(REAL_TOPIC, "")
    if not real_topic:
        raise ValueError(
            f"a message of {quote(topic)} queue {queue_id} has no {REAL_TOPIC} property; "
            "it cannot be delivered"
        )
    real_qid_text = properties.get(REAL_QID, "")
    if not (real_qid_text.isascii() and real_qid_text.isdigit() and len(real_qid_text) <= 10):
        raise ValueError(
            f"a message of {quote(topic)} queue {queue_id} has {REAL_QID} "
            f"{quote(real_qid_text)}; it must be a queue id (0 or more)"
        )
    real_queue_id = int(real_qid_text)
    if real_queue_id > _MAX_QUEUE_ID:
        raise ValueError(
            f"a message of {quote(topic)} queue {queue_id} has {REAL_QID} {real_queue_id}; "
            f"queue ids are at most {_MAX_QUEUE_ID}"
        )
    return real_topic, real_queue_id, _without_bookkeeping(properties)

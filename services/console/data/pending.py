"""The pending page's data: delayed messages not yet due (delay levels in
``SCHEDULE_TOPIC_XXXX``, timed messages in the timer topic) and transactional half
messages not yet resolved, optionally of one topic, each list bounded.

A delay-level message is due at its store time plus its level's delay (the broker's
default level table: a broker started with another ``--delay-levels`` shows other due
times); the ones not due are those stored less than that delay ago, found with
SearchOffset. A timed message is due at its TIMER_DELIVER_MS; the newest
PENDING_MAX_SCANNED messages of the timer topic are read to find them (a recall is a
marker there: the recalled message is left out). The dispatch's metrics count them all
(``tide_dispatch_delay_pending``, ``tide_dispatch_timer_pending``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from services.console.data.limits import PENDING_MAX_LIST, PENDING_MAX_SCANNED
from services.console.data.messages import MessageView, view
from tide.client import Admin, MessageQueue, PullStatus, ReceivedMessage, TopicNotFound
from tide.format import (
    DEFAULT_DELAY_LEVEL_TABLE,
    REAL_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_DEL_UNIQKEY,
    TIMER_DELIVER_MS,
    TIMER_TOPIC,
)
from tide.limits import PULL_MAX_MESSAGES


@dataclass(frozen=True)
class Delayed:
    message: MessageView
    # The topic it will be delivered to.
    real_topic: str
    due_ms: int
    # "level N" or "timer".
    kind: str


@dataclass(frozen=True)
class Half:
    topic: str
    msg_id: str
    unique_key: str
    transaction_id: str
    producer_group: str
    broker: str
    store_ms: int
    # Check-backs made so far.
    checks: int


@dataclass(frozen=True)
class Pending:
    delayed: tuple[Delayed, ...]
    # Non-empty when the list stopped at a limit.
    delayed_truncated: str
    # Not yet due, of every topic, per kind ("level N", "timer"); a level's count is
    # exact (its queue past the oldest not due), the timer's is of the messages read.
    counts: tuple[tuple[str, int], ...]
    halves: tuple[Half, ...]
    halves_truncated: str


def pending(admin: Admin, topic: str = "", now_ms: int | None = None) -> Pending:
    """What is pending (of ``topic``, or of every topic), soonest due first."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    topic = topic.strip()
    counts: dict[str, int] = {}
    delayed, truncated = _delayed(admin, topic, now, counts)
    halves = [
        h
        for h in admin.list_transactions(max_count=PENDING_MAX_LIST + 1)
        if not topic or h.topic == topic
    ]
    halves_truncated = (
        f"only the first {PENDING_MAX_LIST} half messages are shown"
        if len(halves) > PENDING_MAX_LIST
        else ""
    )
    return Pending(
        tuple(delayed),
        truncated,
        tuple((kind, count) for kind, count in counts.items() if count),
        tuple(
            Half(
                h.topic,
                h.msg_id,
                h.unique_key,
                h.transaction_id,
                h.producer_group,
                h.broker_name,
                h.store_timestamp_ms,
                h.checks,
            )
            for h in halves[:PENDING_MAX_LIST]
        ),
        halves_truncated,
    )


def _delayed(
    admin: Admin, topic: str, now: int, counts: dict[str, int]
) -> tuple[list[Delayed], str]:
    partial: list[str] = []
    found = [
        *_level_messages(admin, topic, now, partial, counts),
        *_timer_messages(admin, topic, now, partial, counts),
    ]
    found.sort(key=lambda d: (d.due_ms, d.message.msg_id))
    notes = [f"only {PENDING_MAX_SCANNED} messages of {queue} were read" for queue in partial]
    if len(found) > PENDING_MAX_LIST:
        notes.append(f"only the {PENDING_MAX_LIST} due soonest are shown")
    return found[:PENDING_MAX_LIST], "; ".join(notes)


def _queues(admin: Admin, system_topic: str) -> list[MessageQueue]:
    try:
        route = admin.route(system_topic)
    except TopicNotFound:
        return []
    return sorted(
        MessageQueue(system_topic, data.broker_name, queue_id)
        for data in route.queue_datas
        for queue_id in range(max(data.read_queue_nums, data.write_queue_nums))
    )


def _level_messages(
    admin: Admin, topic: str, now: int, partial: list[str], counts: dict[str, int]
) -> Iterable[Delayed]:
    """Each level's messages stored less than its delay ago, the soonest due first."""
    table = DEFAULT_DELAY_LEVEL_TABLE
    for queue in _queues(admin, SCHEDULE_TOPIC):
        level = queue.queue_id + 1
        if level > table.max_level:
            continue
        delay_ms = table.delay_ms(level)
        start = admin.search_offset(queue, now - delay_ms)
        stored = admin.browse_queue(queue, start, 1)
        kind = f"level {level}"
        counts[kind] = counts.get(kind, 0) + max(
            0, stored.max_offset - max(start, stored.min_offset)
        )
        for message in _read(admin, queue, start, partial):
            due = message.store_timestamp_ms + delay_ms
            if due > now and _of_topic(message, topic):
                real = message.properties.get(REAL_TOPIC, "")
                yield Delayed(view(message), real, due, kind)


def _timer_messages(
    admin: Admin, topic: str, now: int, partial: list[str], counts: dict[str, int]
) -> Iterable[Delayed]:
    """The timer queue's newest messages not due yet and not recalled (any order: a
    timed message's due time is its own)."""
    for queue in _queues(admin, TIMER_TOPIC):
        offsets = admin.browse_queue(queue, 0, 1)
        start = max(offsets.min_offset, offsets.max_offset - PENDING_MAX_SCANNED)
        messages = list(_read(admin, queue, start, partial))
        recalled = {m.properties.get(TIMER_DEL_UNIQKEY) for m in messages}
        for message in messages:
            due = message.properties.get(TIMER_DELIVER_MS, "")
            real = message.properties.get(REAL_TOPIC, "")
            if TIMER_DEL_UNIQKEY in message.properties or not due.isdigit():
                continue  # a recall marker, or not a timed message
            if f"{real}+{message.unique_key}" in recalled or int(due) <= now:
                continue
            counts["timer"] = counts.get("timer", 0) + 1
            if _of_topic(message, topic):
                yield Delayed(view(message), real, int(due), "timer")


def _read(
    admin: Admin, queue: MessageQueue, start: int, partial: list[str]
) -> Iterable[ReceivedMessage]:
    """The queue's messages from ``start``, at most PENDING_MAX_SCANNED of them (the
    queue is added to ``partial`` when there were more)."""
    offset, read = start, 0
    while True:
        wanted = min(PULL_MAX_MESSAGES, PENDING_MAX_SCANNED - read)
        result = admin.browse_queue(queue, offset, wanted)
        if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset > offset:
            offset = result.next_offset  # below the min offset: retention deleted those
            continue
        yield from result.messages
        read += len(result.messages)
        if result.status is not PullStatus.FOUND or result.next_offset <= offset:
            return
        offset = result.next_offset
        if offset >= result.max_offset:
            return
        if read >= PENDING_MAX_SCANNED:
            partial.append(str(queue))
            return


def _of_topic(message: ReceivedMessage, topic: str) -> bool:
    return not topic or message.properties.get(REAL_TOPIC, "") == topic

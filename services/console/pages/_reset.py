"""Resetting a group's offsets to a time (RocketMQ's resetOffsetByTime): per queue of the
topic, SearchOffset(time) then CommitOffset. Not a page: the groups page uses it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from tide.client import Admin, MessageQueue

# Reset times are read as UTC, from a datetime-local field or ISO 8601 text.
TIME_FORMATS = ("%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S")
MAX_RESET_QUEUES = 4096  # queues one reset commits (a topic has at most 1024 per broker)


@dataclass(frozen=True)
class QueueReset:
    broker_name: str
    queue_id: int
    current: int  # -1: never committed
    target: int


@dataclass(frozen=True)
class ResetPlan:
    topic: str
    timestamp_ms: int
    members: tuple[str, ...]
    queues: tuple[QueueReset, ...]


def parse_time_ms(text: str) -> int:
    """``2026-11-27T10:30`` (UTC) in ms since the epoch; ValueError naming the format."""
    cleaned = text.strip().removesuffix("Z")
    for layout in TIME_FORMATS:
        try:
            moment = datetime.strptime(cleaned, layout).replace(tzinfo=UTC)
        except ValueError:
            continue
        return int(moment.timestamp() * 1000)
    raise ValueError("Give a UTC time as YYYY-MM-DDTHH:MM (for example 2026-11-27T10:30).")


def plan_reset(admin: Admin, group: str, topic: str, timestamp_ms: int) -> ResetPlan:
    """What a reset would commit, queue by queue (nothing is changed)."""
    members = tuple(admin.consumers(group))
    plans = []
    for queue in admin.queues(topic)[:MAX_RESET_QUEUES]:
        plans.append(
            QueueReset(
                queue.broker_name,
                queue.queue_id,
                admin.committed(group, queue),
                admin.search_offset(queue, timestamp_ms),
            )
        )
    return ResetPlan(topic, timestamp_ms, members, tuple(plans))


def apply_reset(admin: Admin, group: str, plan: ResetPlan) -> int:
    """Commit each queue's target; the number committed. The targets are searched again:
    the plan shown may be minutes old (new messages change nothing before the time, but
    retention may have removed some: a search answers the oldest kept then)."""
    fresh = plan_reset(admin, group, plan.topic, plan.timestamp_ms)
    for reset in fresh.queues:
        queue = MessageQueue(plan.topic, reset.broker_name, reset.queue_id)
        admin.commit_offset(group, queue, reset.target)
    return len(fresh.queues)

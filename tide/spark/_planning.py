"""Offset planning, free of Spark and of any I/O: what each Spark partition reads.

Queues are named in offsets JSON as ``"<broker_name>/<queue_id>"`` under their topic, like
Spark's Kafka source names partitions: ``{"Orders": {"broker-a/0": 10, "broker-b/3": -2}}``.
In starting/ending offsets ``-2`` means earliest and ``-1`` latest. Offsets are queue
offsets; a range is ``[start, end)`` and ``end`` is the next offset not read (a queue's
``max_offset`` is "latest").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from tide.client import MessageQueue, QueueOffsets

EARLIEST = -2
LATEST = -1
# A streaming offset: {topic: {"broker/queue_id": next offset to read}}.
OffsetsJson = dict[str, dict[str, int]]
# What startingOffsets / endingOffsets say: "earliest", "latest", or per-queue JSON.
OffsetSpec = Literal["earliest", "latest"] | OffsetsJson


class PlanningError(ValueError):
    """Options that cannot be planned (a bad offsets JSON, an end before a start)."""


def queue_key(queue: MessageQueue) -> str:
    return f"{queue.broker_name}/{queue.queue_id}"


def parse_queue_key(topic: str, key: str) -> MessageQueue:
    broker, sep, queue_id = key.rpartition("/")
    if not sep or not broker or not queue_id.isdigit():
        raise PlanningError(
            f"queue {key!r} of topic {topic!r}: name queues as 'broker_name/queue_id', "
            "e.g. 'broker-a/0'"
        )
    return MessageQueue(topic, broker, int(queue_id))


def to_offsets_json(offsets: Mapping[MessageQueue, int]) -> OffsetsJson:
    """Sorted (so equal offsets give equal JSON)."""
    result: OffsetsJson = {}
    for queue in sorted(offsets):
        result.setdefault(queue.topic, {})[queue_key(queue)] = offsets[queue]
    return result


def from_offsets_json(data: Mapping[str, Mapping[str, int]]) -> dict[MessageQueue, int]:
    result: dict[MessageQueue, int] = {}
    for topic, queues in data.items():
        if not isinstance(queues, Mapping):
            raise PlanningError(f"offsets of topic {topic!r} must be a JSON object")
        for key, offset in queues.items():
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise PlanningError(f"offset of {topic}/{key} is {offset!r}; give an integer")
            result[parse_queue_key(topic, key)] = offset
    return result


def parse_offset_spec(text: str, option: str) -> OffsetSpec:
    """``earliest``, ``latest`` or JSON per queue (checked here, resolved later)."""
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return "earliest" if value.lower() == "earliest" else "latest"
    try:
        data = json.loads(value)
    except json.JSONDecodeError as e:
        raise PlanningError(
            f"{option}: give 'earliest', 'latest' or JSON like "
            f'{{"Topic":{{"broker-a/0":10}}}} ({e})'
        ) from None
    if not isinstance(data, dict):
        raise PlanningError(f"{option}: the JSON must be an object of topics")
    return to_offsets_json(from_offsets_json(data))


def resolve(
    spec: OffsetSpec,
    bounds: Mapping[MessageQueue, QueueOffsets],
    *,
    missing: Literal["earliest", "latest"],
) -> dict[MessageQueue, int]:
    """One offset per queue of ``bounds``. Queues the JSON does not name get ``missing``;
    explicit offsets are clamped into the queue's [min, max]. Queues the JSON names that
    are not in ``bounds`` (not in the route) are an error."""
    explicit: dict[MessageQueue, int] = {}
    default = missing
    if isinstance(spec, str):
        default = spec
    else:
        explicit = from_offsets_json(spec)
        unknown = sorted(set(explicit) - set(bounds))
        if unknown:
            names = ", ".join(map(str, unknown))
            raise PlanningError(f"offsets name queues not in the route: {names}")
    result: dict[MessageQueue, int] = {}
    for queue, bound in bounds.items():
        offset = explicit.get(queue, EARLIEST if default == "earliest" else LATEST)
        if offset == EARLIEST:
            result[queue] = bound.min_offset
        elif offset == LATEST:
            result[queue] = bound.max_offset
        else:
            result[queue] = min(max(offset, bound.min_offset), bound.max_offset)
    return result


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Queue offsets ``[start, end)`` of one queue: one Spark partition's work."""

    queue: MessageQueue
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


def plan_ranges(
    starts: Mapping[MessageQueue, int],
    ends: Mapping[MessageQueue, int],
    max_per_partition: int | None = None,
) -> list[QueueRange]:
    """One range per queue with data (in queue order), split into pieces of at most
    ``max_per_partition`` offsets. Queues in ``ends`` but not in ``starts`` start at 0
    (a queue that appeared since the start: read from its first message)."""
    if max_per_partition is not None and max_per_partition < 1:
        raise PlanningError(f"maxMessagesPerPartition is {max_per_partition}; give 1 or more")
    ranges: list[QueueRange] = []
    for queue in sorted(ends):
        start, end = starts.get(queue, 0), ends[queue]
        if end < start:
            raise PlanningError(f"{queue}: the end offset {end} is before the start {start}")
        step = max_per_partition or max(end - start, 1)
        ranges.extend(
            QueueRange(queue, piece, min(piece + step, end)) for piece in range(start, end, step)
        )
    return ranges


def limit_offsets(
    starts: Mapping[MessageQueue, int],
    latest: Mapping[MessageQueue, int],
    max_messages: int | None,
) -> dict[MessageQueue, int]:
    """End offsets for a micro-batch of at most ``max_messages`` offsets in all.

    Every queue of ``latest`` is in the result (queues missing from ``starts`` start at 0);
    an end never goes below its start. Over the limit, each queue gets a share of the
    limit proportional to its lag (as Spark's Kafka source does); the remainder goes to
    the queues with the largest lag first, so a batch always makes progress.
    """
    begin = {queue: starts.get(queue, 0) for queue in latest}
    lag = {queue: max(latest[queue] - begin[queue], 0) for queue in latest}
    total = sum(lag.values())
    if max_messages is None or total <= max_messages:
        return {queue: begin[queue] + lag[queue] for queue in latest}
    if max_messages < 1:
        raise PlanningError(f"maxMessagesPerTrigger is {max_messages}; give 1 or more")
    share = {queue: lag[queue] * max_messages // total for queue in latest}
    left = max_messages - sum(share.values())
    for queue in sorted(latest, key=lambda q: (-(lag[q] - share[q]), q)):
        if left <= 0:
            break
        if share[queue] < lag[queue]:
            share[queue] += 1
            left -= 1
    return {queue: begin[queue] + share[queue] for queue in latest}


def cap_offsets(
    ends: Mapping[MessageQueue, int], target: Mapping[MessageQueue, int]
) -> dict[MessageQueue, int]:
    """``ends`` no further than ``target`` (Trigger.AvailableNow): queues not in the target
    are left out; a queue's end is at most its target."""
    return {queue: min(end, target[queue]) for queue, end in ends.items() if queue in target}


def merge_starts(
    previous: Mapping[MessageQueue, int], queues: Iterable[MessageQueue]
) -> dict[MessageQueue, int]:
    """``previous`` plus new queues at 0 (their first message)."""
    result = dict(previous)
    for queue in queues:
        result.setdefault(queue, 0)
    return result

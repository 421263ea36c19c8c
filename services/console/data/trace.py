"""A message's trace as the broker knows it: born, stored, and for each consumer group
with an offset on its queue, whether the group consumed past it (pull groups: the
committed offset; POP groups: the next offset a Receive takes, and how many of the
queue's messages are in flight), its retry copies (``%RETRY%<group>``) and dead letter
(``%DLQ%<group>``) found by the message's unique key; plus a link to the OpenTelemetry
trace when the message carries a ``traceparent`` and the console has a trace URL
template."""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from services.console.data.limits import TRACE_MAX_GROUPS, TRACE_MAX_RETRY_COPIES
from services.console.data.messages import MessageView, view
from tide.client import Admin, NotFound, ReceivedMessage, TopicNotFound
from tide.dead_letters import DLQ_PREFIX, RETRY_PREFIX

# W3C trace context: version-trace_id-parent_id-flags, lowercase hex.
TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
TRACE_ID_FIELD = "{trace_id}"


class DeliveryState(enum.Enum):
    # The group's offset on the queue is past the message.
    CONSUMED = "consumed"
    # A POP group took it and has not acked it yet (its queue has messages in flight).
    IN_FLIGHT = "in flight"
    # The group's offset has not reached it.
    NOT_YET = "not consumed yet"


@dataclass(frozen=True)
class Copy:
    """A retry copy or the dead letter of the message, for a group."""

    msg_id: str
    stored_topic: str
    store_ms: int
    reconsume_times: int


@dataclass(frozen=True)
class GroupDelivery:
    group: str
    state: DeliveryState
    # The group's offset on the message's queue (the next message it will take).
    consumer_offset: int
    # POP: messages of the queue received and not acked.
    inflight: int
    retries: tuple[Copy, ...]
    dead_letter: Copy | None


@dataclass(frozen=True)
class Trace:
    message: MessageView
    deliveries: tuple[GroupDelivery, ...]
    # Non-empty when not every group was looked at (TRACE_MAX_GROUPS).
    truncated: str
    trace_id: str
    # The OpenTelemetry trace's page ("" without a template or a traceparent).
    trace_url: str


def trace_id(traceparent: str) -> str:
    """The trace id of a W3C ``traceparent`` ("" when it is not one)."""
    match = TRACEPARENT_RE.match(traceparent.strip().lower())
    if match is None or match.group(1) == "0" * 32:
        return ""
    return match.group(1)


def check_trace_url_template(template: str) -> None:
    """``--trace-url-template`` must name where the trace id goes."""
    if template and TRACE_ID_FIELD not in template:
        raise ValueError(
            f"--trace-url-template {template[:80]!r} has no {TRACE_ID_FIELD}: give e.g. "
            "http://jaeger:16686/trace/{trace_id}"
        )


def trace(
    admin: Admin, msg_id: str, trace_url_template: str = "", groups: Sequence[str] = ()
) -> Trace:
    """The trace of the message with ``msg_id``; NotFound when no broker has it.

    The groups looked at are those with a stored config (``tide group create``, the
    console's groups page) and ``groups`` (named by the operator: a group that only
    pulls and commits has no config, and no call lists the groups with offsets on a
    topic)."""
    message = admin.query_id(msg_id)
    named = {group.strip() for group in groups if group.strip()}
    groups = sorted(named | {config.group_name for config in admin.list_groups()})
    truncated = ""
    if len(groups) > TRACE_MAX_GROUPS:
        truncated = f"only the first {TRACE_MAX_GROUPS} of {len(groups)} groups were looked at"
        groups = groups[:TRACE_MAX_GROUPS]
    deliveries = [d for group in groups if (d := _delivery(admin, message, group)) is not None]
    found = trace_id(message.properties.get("traceparent", ""))
    url = trace_url_template.replace(TRACE_ID_FIELD, found) if found and trace_url_template else ""
    return Trace(view(message), tuple(deliveries), truncated, found, url)


def _delivery(admin: Admin, message: ReceivedMessage, group: str) -> GroupDelivery | None:
    """The group's state for the message; None when the group has no offset on its queue
    (it does not consume the topic) and holds no copy of it."""
    offset, inflight = _group_offset(admin, message, group)
    retries, dead = _copies(admin, message, group)
    if offset < 0 and not retries and dead is None:
        return None
    if offset > message.queue_offset:
        state = DeliveryState.CONSUMED
    elif offset == message.queue_offset and inflight > 0:
        state = DeliveryState.IN_FLIGHT
    else:
        state = DeliveryState.NOT_YET
    return GroupDelivery(group, state, offset, inflight, retries, dead)


def _group_offset(admin: Admin, message: ReceivedMessage, group: str) -> tuple[int, int]:
    """(consumer offset, in flight) of ``group`` on the message's queue; (-1, 0) when none."""
    lag = admin.group_lag(group, message.queue.topic)
    for queue in lag.queues:
        if queue.broker_name == message.queue.broker_name and (
            queue.queue_id == message.queue.queue_id
        ):
            return queue.consumer_offset, queue.inflight
    return -1, 0


def _copies(
    admin: Admin, message: ReceivedMessage, group: str
) -> tuple[tuple[Copy, ...], Copy | None]:
    if not message.unique_key:
        return (), None
    retries = _find(admin, RETRY_PREFIX + group, message.unique_key)
    dead = _find(admin, DLQ_PREFIX + group, message.unique_key)
    return tuple(retries[:TRACE_MAX_RETRY_COPIES]), (dead[0] if dead else None)


def _find(admin: Admin, topic: str, unique_key: str) -> list[Copy]:
    try:
        found = admin.query_unique_key(topic, unique_key)
    except (TopicNotFound, NotFound):
        return []
    copies = [Copy(m.msg_id, m.queue.topic, m.store_timestamp_ms, m.reconsume_times) for m in found]
    return sorted(copies, key=lambda c: (c.store_ms, c.msg_id))

"""The common timed produce request: one topic, each message only a body and a delivery
time (``deliver_at_ms`` or ``delay_ms``), all of it ahead and within every broker's
timer maximum.

Such a batch is what a producer of timed messages sends most, and the general path
(produce.py: a ``_Pending`` per message, each message checked field by field and against
each broker, its properties built as a dict then encoded) cost about as much per
message as the whole plain path. Here it is told from sizes (as bodies_only.py tells a
batch of bodies), checked against the brokers' bounds by its earliest and latest time,
and its records encoded in one loop: the bytes :func:`scheduled.scheduled_record` gives
each message (``tide.format.timer_properties`` of a message with no properties: its
``UNIQ_KEY``, then ``TIMER_DELIVER_MS``, ``TIMER_OUT_MS``, ``REAL_TOPIC``, ``REAL_QID``),
in ``rmq_sys_wheel_timer`` queue 0. Anything else (a time already due or past a maximum,
a broker without a timer) goes the general way, which answers it exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.gateway.bodies_only import field_bytes, varint_bytes
from services.gateway.scheduled import DeliveryBounds
from tide.format import (
    REAL_QID,
    REAL_TOPIC,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
    UNIQ_KEY,
    RunWriter,
    TimerWheelGeometry,
    timer_deliver_error,
    timer_precision_ms,
    timer_slot_time_ms,
)
from tide.v1 import gateway_pb2 as pb

# deliver_at_ms (12) and delay_ms (13): a one-byte key, then the value as a varint.
_DELAY_KEY_BYTES = 1


def timed_deliveries(
    messages: Sequence[pb.ProduceMessage],
    topic: str,
    messages_bytes: int,
    max_body_bytes: int,
    now_ms: int,
) -> list[int] | None:
    """Each message's delivery time (ms since the epoch; ``delay_ms`` counts from
    ``now_ms``) when every message is ``topic``, a body of 1..``max_body_bytes`` bytes and
    exactly one of ``deliver_at_ms`` / ``delay_ms`` above 0, and nothing else (the
    encoded size of the messages, ``messages_bytes``, is exactly that); else None."""
    topic_field = field_bytes(len(topic.encode()))
    expected = 0
    deliveries: list[int] = []
    for message in messages:
        body_bytes = len(message.body)
        at_ms, delay_ms = message.deliver_at_ms, message.delay_ms
        if at_ms < 0 or delay_ms < 0 or (at_ms > 0) == (delay_ms > 0):
            return None
        if not 0 < body_bytes <= max_body_bytes:
            return None
        value = at_ms or delay_ms
        inner = topic_field + field_bytes(body_bytes) + _DELAY_KEY_BYTES + varint_bytes(value)
        expected += field_bytes(inner)
        deliveries.append(at_ms or now_ms + delay_ms)
    # As bodies_only.py: a message's size is at least these fields, so equal totals mean
    # no message has any other (tags, keys, properties, unique key, route, flag, ...).
    return deliveries if expected == messages_bytes else None


def within_bounds(deliveries: Sequence[int], bounds: Sequence[DeliveryBounds], now_ms: int) -> bool:
    """Every delivery is ahead of ``now_ms`` (none goes straight to its real topic) and
    within the timer maximum of every broker the batch may go to."""
    if min(deliveries) <= now_ms:
        return False
    latest = max(deliveries)
    for found in bounds:
        if found.timer_max_delay_ms <= 0:
            return False
        if timer_deliver_error(latest, now_ms, found.timer_max_delay_ms // 1000) is not None:
            return False
    return True


def encode_timed(
    writer: RunWriter,
    timer_topic_part: tuple[int, bytes],
    bodies: Sequence[bytes],
    unique_keys: Sequence[str],
    deliveries: Sequence[int],
    real: tuple[str, int],
    precision_ms: int,
    now_ms: int,
) -> None:
    """The batch's records into ``writer``: timer topic queue 0, born ``now_ms``, for the
    ``real`` (topic, queue id), the properties as ``scheduled_record`` encodes them."""
    real_topic, real_queue_id = real
    geometry = TimerWheelGeometry(precision_ms=timer_precision_ms(precision_ms))
    eq, sep = "\x01", "\x02"  # tide.format's property layout (encode_properties)
    tail = f"{REAL_TOPIC}{eq}{real_topic}{sep}{REAL_QID}{eq}{real_queue_id}{sep}"
    properties = [
        (
            f"{UNIQ_KEY}{eq}{key}{sep}{TIMER_DELIVER_MS}{eq}{deliver_ms}{sep}"
            f"{TIMER_OUT_MS}{eq}{timer_slot_time_ms(geometry, deliver_ms)}{sep}{tail}"
        ).encode()
        for key, deliver_ms in zip(unique_keys, deliveries, strict=True)
    ]
    magic, part = timer_topic_part
    writer.add_many(magic, part, [0] * len(bodies), bodies, properties, now_ms)

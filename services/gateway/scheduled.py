"""Delayed and timed produce: the rewrite into SCHEDULE_TOPIC_XXXX or rmq_sys_wheel_timer.

RocketMQ 5's proxy + ``HookUtils`` role (docs/delivery.md, "Delay levels"). A message with
``delay_level``, ``deliver_at_ms`` or ``delay_ms`` first gets its real topic's queue as
any message does; its record is then stored in the schedule topic (queue ``level - 1``)
or the timer topic (queue 0) of that queue's broker, with the properties of
``tide.format.delay_level_properties`` / ``timer_properties``. The dispatch of that
broker delivers it to the real queue when due. A time at or before now is no delay: the
message goes to its real queue as it is.

The bounds are the broker's: its dispatch's ``GetStatus().delivery`` (level table, timer
maximum and precision), cached per dispatch address for :data:`BOUNDS_TTL_S` and fetched
again on the first delayed produce after that (a failed fetch keeps serving the last
answer; without one the produce fails UNAVAILABLE). Only requests with a delayed message
ever look them up: the produce path of other messages is unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

from services.gateway.brokers import BrokerChannels, broker_error
from services.gateway.routes import Member
from tide.format import (
    DELAYED_TRANSACTION_ERROR,
    KEYS,
    SCHEDULE_TOPIC,
    TAGS,
    TIMER_TOPIC,
    TRAN_MSG,
    UNIQ_KEY,
    DelayLevelTable,
    delay_level_properties,
    encode_properties,
    schedule_queue_id,
    timer_deliver_error,
    timer_due_now,
    timer_precision_ms,
    timer_properties,
)
from tide.server import ServiceError
from tide.v1 import dispatch_pb2
from tide.v1 import gateway_pb2 as pb

log = logging.getLogger("tide.gateway.scheduled")

BOUNDS_TTL_S = 30.0
"""How long a broker's delivery bounds are used before they are asked again."""
MAX_CACHED_BOUNDS = 1024  # dispatch addresses
STATUS_TIMEOUT_S = 5.0


def _invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass(frozen=True, slots=True)
class DeliveryBounds:
    """What one broker's dispatch accepts (its GetStatus().delivery)."""

    broker_name: str
    table: DelayLevelTable | None  # None: the dispatch reports no table (an old dispatch)
    timer_max_delay_ms: int  # 0: the dispatch runs no timer
    timer_precision_ms: int


@dataclass(frozen=True, slots=True)
class Scheduled:
    """Where a delayed message's record goes, and its properties (encoded)."""

    topic: str
    queue_id: int
    properties: bytes


def is_delayed(message: pb.ProduceMessage) -> bool:
    return bool(message.delay_level or message.deliver_at_ms or message.delay_ms)


def static_delay_error(where: str, message: pb.ProduceMessage) -> str | None:
    """What is wrong with the delay fields whatever the broker, or None."""
    given = [
        name for name in ("delay_level", "deliver_at_ms", "delay_ms") if getattr(message, name) != 0
    ]
    if len(given) > 1:
        return f"{where}: set one of delay_level, deliver_at_ms, delay_ms (got {', '.join(given)})"
    for name in ("delay_level", "deliver_at_ms", "delay_ms"):
        value = getattr(message, name)
        if value < 0:
            return f"{where}.{name} is {value}; must be > 0 (0: no delay)"
    if given and (message.transactional or message.properties.get(TRAN_MSG) == "true"):
        return f"{where}: {DELAYED_TRANSACTION_ERROR} ({TRAN_MSG} with {given[0]})"
    return None


def deliver_at_ms(message: pb.ProduceMessage, now_ms: int) -> int:
    """The absolute delivery time of a timed message (``delay_ms`` counts from now)."""
    return message.deliver_at_ms or now_ms + message.delay_ms


def broker_delay_error(
    where: str, message: pb.ProduceMessage, bounds: DeliveryBounds, now_ms: int
) -> ServiceError | None:
    """Why ``bounds``' broker cannot take this delayed message, or None."""
    if message.delay_level:
        if bounds.table is None:
            return ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{where}.delay_level: broker {bounds.broker_name}'s dispatch reports no "
                "delay level table (upgrade it, or send without delay_level)",
            )
        error = bounds.table.level_error(message.delay_level)
        return None if error is None else _invalid(f"{where}.{error}")
    deliver_ms = deliver_at_ms(message, now_ms)
    if timer_due_now(deliver_ms, now_ms):
        return None  # delivered now: no timer needed
    if bounds.timer_max_delay_ms <= 0:
        return ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{where}: broker {bounds.broker_name}'s dispatch runs no timer, so it cannot "
            "take deliver_at_ms / delay_ms; use delay_level, or a broker with a timer",
        )
    max_delay_s = bounds.timer_max_delay_ms // 1000
    error = timer_deliver_error(deliver_ms, now_ms, max_delay_s)
    if error is None:
        return None
    return _invalid(f"{where}: {error}; lower it, or raise the dispatch's --timer-max-delay-ms")


def scheduled_record(
    message: pb.ProduceMessage,
    real_queue_id: int,
    unique_key: str,
    bounds: DeliveryBounds,
    now_ms: int,
) -> Scheduled:
    """The record a delayed message (checked by :func:`broker_delay_error`) is stored as."""
    properties = dict(message.properties)
    properties[UNIQ_KEY] = unique_key
    if message.tags:
        properties[TAGS] = message.tags
    if message.keys:
        properties[KEYS] = " ".join(message.keys)
    real_topic = message.topic
    if message.delay_level:
        level = message.delay_level
        rewritten = delay_level_properties(properties, real_topic, real_queue_id, level)
        return Scheduled(SCHEDULE_TOPIC, schedule_queue_id(level), encode_properties(rewritten))
    deliver_ms = deliver_at_ms(message, now_ms)
    rewritten = timer_properties(
        properties,
        real_topic,
        real_queue_id,
        deliver_ms,
        now_ms,
        timer_precision_ms(bounds.timer_precision_ms),  # one of the wheel's precisions
    )
    if timer_due_now(deliver_ms, now_ms):
        return Scheduled(real_topic, real_queue_id, encode_properties(rewritten))
    return Scheduled(TIMER_TOPIC, 0, encode_properties(rewritten))


class DeliveryBoundsCache:
    """Each broker's delivery bounds, by dispatch address (see the module doc)."""

    def __init__(
        self, channels: BrokerChannels, clock_s: Callable[[], float] = time.monotonic
    ) -> None:
        self._channels = channels
        self._clock_s = clock_s
        self._cached: dict[str, tuple[float, DeliveryBounds]] = {}

    async def bounds_of(self, members: Iterable[Member]) -> dict[str, DeliveryBounds]:
        """Bounds per dispatch address of ``members`` (asked concurrently when stale)."""
        unique = {member.dispatch: member for member in members}
        found = await asyncio.gather(*(self._get(member) for member in unique.values()))
        return dict(zip(unique, found, strict=True))

    async def _get(self, member: Member) -> DeliveryBounds:
        now_s = self._clock_s()
        cached = self._cached.get(member.dispatch)
        if cached is not None and now_s - cached[0] < BOUNDS_TTL_S:
            return cached[1]
        try:
            status = await self._channels.dispatch(member.dispatch).GetStatus(
                dispatch_pb2.GetDispatchStatusRequest(), timeout=STATUS_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            if cached is not None:
                log.warning(
                    "dispatch %s of broker %s: %s; using its delivery bounds of %.0f s ago",
                    member.dispatch,
                    member.broker_name,
                    exc.code().name,
                    now_s - cached[0],
                )
                return cached[1]
            raise broker_error(
                exc, f"learning broker {member.broker_name}'s delay bounds from its dispatch"
            ) from exc
        bounds = _bounds(member.broker_name, status.delivery)
        if len(self._cached) >= MAX_CACHED_BOUNDS and member.dispatch not in self._cached:
            self._cached.clear()
        self._cached[member.dispatch] = (now_s, bounds)
        return bounds


def _bounds(broker_name: str, delivery: dispatch_pb2.DeliveryStatus) -> DeliveryBounds:
    table = DelayLevelTable(tuple(delivery.delay_levels_ms)) if delivery.delay_levels_ms else None
    return DeliveryBounds(
        broker_name, table, delivery.timer_max_delay_ms, delivery.timer_precision_ms
    )

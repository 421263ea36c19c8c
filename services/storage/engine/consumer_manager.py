"""Consumer group membership (RocketMQ's ConsumerManager), in memory only.

group -> {client_id -> (subscriptions, last heartbeat)}. A heartbeat adds or refreshes a
member and replaces its subscriptions; a member silent for longer than the expiry is
invisible at once and removed by the next scan (:meth:`ConsumerManager.remove_expired`).
Consumers heartbeat every few seconds, so a restarted storage is complete again within
one heartbeat period.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tide.files import ConfigLimitError
from tide.limits import (
    CLIENT_ID_MAX_CHARS,
    EXPRESSION_MAX_CHARS,
    SUBSCRIPTIONS_MAX_COUNT,
    limit_text,
    quote,
)
from tide.naming import consumer_group_error, topic_error

DEFAULT_EXPIRY_MS = 120_000
DEFAULT_MAX_GROUPS = 10_000
DEFAULT_MAX_MEMBERS_PER_GROUP = 1_000
DEFAULT_MAX_SUBSCRIPTIONS = SUBSCRIPTIONS_MAX_COUNT  # what the gateway lets through
SUBSCRIBE_ALL = "*"


class InvalidConsumerError(ValueError):
    """A heartbeat field that is malformed (INVALID_ARGUMENT); the message names it."""


@dataclass(frozen=True, slots=True)
class Subscription:
    topic: str
    expression: str = SUBSCRIBE_ALL


@dataclass(frozen=True, slots=True)
class Member:
    client_id: str
    subscriptions: tuple[Subscription, ...]
    last_heartbeat_ms: int  # wall clock, for display
    seen_monotonic_ms: int  # for expiry (immune to wall clock steps)


def client_id_error(client_id: str) -> str | None:
    if not client_id:
        return "client_id is empty; give a per-instance id such as HOST@PID"
    if len(client_id) > CLIENT_ID_MAX_CHARS:
        return (
            f"client_id is {len(client_id)} characters long; the limit is "
            f"{limit_text('CLIENT_ID_MAX_CHARS')}"
        )
    if not client_id.isprintable() or any(c.isspace() for c in client_id):
        return f"client_id {quote(client_id)} contains a space or control character"
    return None


def check_subscriptions(
    subscriptions: Sequence[Subscription], max_subscriptions: int
) -> tuple[Subscription, ...]:
    """Validate; an empty expression means ``*``. Returns them sorted by topic."""
    if len(subscriptions) > max_subscriptions:
        raise InvalidConsumerError(
            f"{len(subscriptions)} subscriptions; a member may have at most {max_subscriptions}"
        )
    seen: dict[str, Subscription] = {}
    for index, sub in enumerate(subscriptions):
        error = topic_error(sub.topic)
        if error is not None:
            raise InvalidConsumerError(f"subscriptions[{index}]: {error}")
        if sub.topic in seen:
            raise InvalidConsumerError(
                f"subscriptions[{index}]: topic {quote(sub.topic)} is listed twice; "
                'join the tags into one expression ("A || B")'
            )
        if len(sub.expression) > EXPRESSION_MAX_CHARS:
            raise InvalidConsumerError(
                f"subscriptions[{index}]: expression is {len(sub.expression)} characters "
                f"long; the limit is {limit_text('EXPRESSION_MAX_CHARS')}"
            )
        seen[sub.topic] = Subscription(sub.topic, sub.expression.strip() or SUBSCRIBE_ALL)
    return tuple(seen[topic] for topic in sorted(seen))


def _check_ids(group: str, client_id: str) -> None:
    for error in (consumer_group_error(group), client_id_error(client_id)):
        if error is not None:
            raise InvalidConsumerError(error)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class ConsumerManager:
    """Thread-safe: the RPC handlers and the expiry scan call it concurrently."""

    def __init__(
        self,
        *,
        expiry_ms: int = DEFAULT_EXPIRY_MS,
        max_groups: int = DEFAULT_MAX_GROUPS,
        max_members_per_group: int = DEFAULT_MAX_MEMBERS_PER_GROUP,
        max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
        clock_ms: Callable[[], int] = _wall_ms,
        monotonic_ms: Callable[[], int] = _monotonic_ms,
    ) -> None:
        self.expiry_ms = expiry_ms
        self.max_groups = max_groups
        self.max_members_per_group = max_members_per_group
        self.max_subscriptions = max_subscriptions
        self._clock_ms = clock_ms
        self._monotonic_ms = monotonic_ms
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, Member]] = {}

    def heartbeat(self, group: str, client_id: str, subscriptions: Sequence[Subscription]) -> bool:
        """Add or refresh a member; True when it is new (or had expired)."""
        _check_ids(group, client_id)
        subs = check_subscriptions(subscriptions, self.max_subscriptions)
        now = self._monotonic_ms()
        member = Member(client_id, subs, self._clock_ms(), now)
        with self._lock:
            members = self._groups.get(group)
            if members is None:
                if len(self._groups) >= self.max_groups:
                    raise ConfigLimitError(
                        f"cannot add consumer group {quote(group)}: this storage already "
                        f"tracks the limit of {self.max_groups} groups"
                    )
                members = self._groups[group] = {}
            previous = members.get(client_id)
            if previous is None and len(members) >= self.max_members_per_group:
                self._drop_expired(group, members, now)
                if len(members) >= self.max_members_per_group:
                    raise ConfigLimitError(
                        f"consumer group {quote(group)} already has the limit of "
                        f"{self.max_members_per_group} members; {quote(client_id)} was not added"
                    )
            members[client_id] = member
            self._groups[group] = members  # the expiry pass above may have removed it
        return previous is None or self._expired(previous, now)

    def unregister(self, group: str, client_id: str) -> bool:
        """Remove a member; False when it was not registered (or had expired)."""
        _check_ids(group, client_id)
        now = self._monotonic_ms()
        with self._lock:
            members = self._groups.get(group)
            if members is None or client_id not in members:
                return False
            member = members.pop(client_id)
            if not members:
                del self._groups[group]
        return not self._expired(member, now)

    def members(self, group: str) -> list[Member]:
        """The group's live members, sorted by client id."""
        error = consumer_group_error(group)
        if error is not None:
            raise InvalidConsumerError(error)
        now = self._monotonic_ms()
        with self._lock:
            members = list(self._groups.get(group, {}).values())
        live = [member for member in members if not self._expired(member, now)]
        return sorted(live, key=lambda member: member.client_id)

    def remove_expired(self) -> list[tuple[str, Member]]:
        """Remove every member silent longer than the expiry; returns (group, member)."""
        now = self._monotonic_ms()
        removed: list[tuple[str, Member]] = []
        with self._lock:
            for group, members in list(self._groups.items()):
                removed += [(group, m) for m in self._drop_expired(group, members, now)]
        return removed

    def group_count(self) -> int:
        with self._lock:
            return len(self._groups)

    def _expired(self, member: Member, now_ms: int) -> bool:
        return now_ms - member.seen_monotonic_ms > self.expiry_ms

    def _drop_expired(self, group: str, members: dict[str, Member], now_ms: int) -> list[Member]:
        """Holds the lock."""
        expired = [m for m in members.values() if self._expired(m, now_ms)]
        for member in expired:
            del members[member.client_id]
        if not members:
            del self._groups[group]
        return expired

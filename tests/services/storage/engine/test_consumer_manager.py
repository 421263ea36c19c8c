"""ConsumerManager: group membership, subscriptions, expiry and limits (fake clocks)."""

from __future__ import annotations

import pytest

from services.storage.engine.consumer_expiry import scan_interval_ms
from services.storage.engine.consumer_manager import (
    ConsumerManager,
    InvalidConsumerError,
    Subscription,
)
from tide.files import ConfigLimitError


class FakeClock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def mono() -> FakeClock:
    return FakeClock(5_000)


@pytest.fixture
def consumers(mono: FakeClock) -> ConsumerManager:
    return ConsumerManager(expiry_ms=1000, clock_ms=FakeClock(1_700_000_000_000), monotonic_ms=mono)


def test_heartbeats_add_and_refresh_members(consumers: ConsumerManager) -> None:
    assert consumers.heartbeat("G", "c2", [Subscription("T1", "A || B")])
    assert consumers.heartbeat("G", "c1", [Subscription("T2", ""), Subscription("T1", " * ")])
    assert not consumers.heartbeat("G", "c1", [Subscription("T1")])  # a refresh
    members = consumers.members("G")
    assert [m.client_id for m in members] == ["c1", "c2"]
    assert members[0].subscriptions == (Subscription("T1", "*"),)  # replaced
    assert members[1].subscriptions == (Subscription("T1", "A || B"),)
    assert members[0].last_heartbeat_ms == 1_700_000_000_000
    assert consumers.members("Other") == []


def test_subscriptions_are_sorted_and_empty_means_everything(consumers: ConsumerManager) -> None:
    consumers.heartbeat("G", "c", [Subscription("Zed", ""), Subscription("Alpha", "TagA")])
    (member,) = consumers.members("G")
    assert member.subscriptions == (Subscription("Alpha", "TagA"), Subscription("Zed", "*"))


def test_unregister(consumers: ConsumerManager) -> None:
    consumers.heartbeat("G", "c1", [])
    consumers.heartbeat("G", "c2", [])
    assert consumers.unregister("G", "c1")
    assert not consumers.unregister("G", "c1")
    assert not consumers.unregister("Nope", "c1")
    assert [m.client_id for m in consumers.members("G")] == ["c2"]
    assert consumers.unregister("G", "c2")
    assert consumers.group_count() == 0


def test_silent_members_expire(consumers: ConsumerManager, mono: FakeClock) -> None:
    consumers.heartbeat("G", "old", [])
    mono.now_ms += 600
    consumers.heartbeat("G", "new", [])
    mono.now_ms += 401  # "old" is 1001 ms silent, "new" 401 ms
    assert [m.client_id for m in consumers.members("G")] == ["new"]  # hidden before the scan
    removed = consumers.remove_expired()
    assert [(group, m.client_id) for group, m in removed] == [("G", "old")]
    assert consumers.remove_expired() == []
    assert consumers.heartbeat("G", "old", [])  # back as a new member
    mono.now_ms += 2000
    assert {m.client_id for _, m in consumers.remove_expired()} == {"old", "new"}
    assert consumers.group_count() == 0


def test_an_expired_member_does_not_count_as_existing(
    consumers: ConsumerManager, mono: FakeClock
) -> None:
    consumers.heartbeat("G", "c", [])
    mono.now_ms += 1001
    assert not consumers.unregister("G", "c")


def test_limits(mono: FakeClock) -> None:
    consumers = ConsumerManager(
        expiry_ms=1000,
        max_groups=2,
        max_members_per_group=2,
        max_subscriptions=2,
        monotonic_ms=mono,
    )
    consumers.heartbeat("G1", "a", [])
    consumers.heartbeat("G2", "a", [])
    with pytest.raises(ConfigLimitError, match="limit of 2 groups"):
        consumers.heartbeat("G3", "a", [])
    consumers.heartbeat("G1", "b", [])
    with pytest.raises(ConfigLimitError, match="already has the limit of 2 members"):
        consumers.heartbeat("G1", "c", [])
    mono.now_ms += 1001  # expired members make room at once, before any scan
    consumers.heartbeat("G1", "c", [])
    assert [m.client_id for m in consumers.members("G1")] == ["c"]
    subs = [Subscription("T1"), Subscription("T2"), Subscription("T3")]
    with pytest.raises(InvalidConsumerError, match="at most 2"):
        consumers.heartbeat("G1", "c", subs)


@pytest.mark.parametrize(
    ("group", "client_id", "subscriptions", "fragment"),
    [
        ("", "c", [], "consumer group is empty"),
        ("bad group", "c", [], "contains ' '"),
        ("G", "", [], "client_id is empty"),
        ("G", "a b", [], "client_id 'a b' contains a space"),
        ("G", "x" * 256, [], "the limit is 255"),
        ("G", "c", [Subscription("bad/topic")], "subscriptions[0]: topic 'bad/topic'"),
        ("G", "c", [Subscription("T"), Subscription("T", "A")], "subscriptions[1]: topic 'T' is"),
        ("G", "c", [Subscription("T", "x" * 4097)], "expression is 4097 characters"),
    ],
)
def test_bad_heartbeats_name_the_field(
    consumers: ConsumerManager,
    group: str,
    client_id: str,
    subscriptions: list[Subscription],
    fragment: str,
) -> None:
    with pytest.raises(InvalidConsumerError) as info:
        consumers.heartbeat(group, client_id, subscriptions)
    assert fragment in str(info.value)
    assert consumers.group_count() == 0


def test_scan_interval_follows_the_expiry() -> None:
    assert scan_interval_ms(120_000) == 10_000
    assert scan_interval_ms(1_000) == 500
    assert scan_interval_ms(1) == 1

"""services/storage/engine/queue_locks.py with a hand-driven clock: lock, renew,
refuse another client, expiry, unlock, the grace after a start, the bound."""

from __future__ import annotations

import pytest

from services.storage.engine.queue_locks import QueueLockManager, TooManyLocks

LIVE_MS = 1_000
Q0, Q1 = ("T", 0), ("T", 1)


class Clock:
    def __init__(self) -> None:
        self.now_ms = 5_000

    def __call__(self) -> int:
        return self.now_ms


def manager(clock: Clock, *, grace: bool = False, max_locks: int = 100) -> QueueLockManager:
    return QueueLockManager(LIVE_MS, clock_ms=clock, grace=grace, max_locks=max_locks)


def test_one_holder_per_queue_renewed_by_its_holder() -> None:
    clock = Clock()
    locks = manager(clock)
    assert locks.lock("g", "a", [Q0, Q1]) == [Q0, Q1]
    assert locks.lock("g", "b", [Q1, Q0]) == []  # held by a
    assert locks.lock("other-group", "b", [Q0]) == [Q0]  # a lease is per group
    clock.now_ms += LIVE_MS  # exactly the lease: still a's
    assert locks.holder("g", "T", 0) == "a"
    assert locks.lock("g", "a", [Q0]) == [Q0]  # renewed (Q1 is not)
    clock.now_ms += 1
    assert locks.holder("g", "T", 1) is None  # Q1 expired
    assert locks.lock("g", "b", [Q0, Q1]) == [Q1]
    assert locks.holder("g", "T", 1) == "b"
    views = locks.locks("g", "T")
    assert [(v.queue_id, v.client_id, v.expires_in_ms) for v in views] == [
        (0, "a", LIVE_MS - 1),  # renewed 1 ms before
        (1, "b", LIVE_MS),
    ]
    assert locks.locks("g", "U") == []


def test_unlock_releases_only_the_holders_queues() -> None:
    clock = Clock()
    locks = manager(clock)
    locks.lock("g", "a", [Q0])
    locks.lock("g", "b", [Q1])
    assert locks.unlock("g", "a", [Q0, Q1]) == 1  # Q1 is b's
    assert locks.holder("g", "T", 0) is None
    assert locks.holder("g", "T", 1) == "b"
    assert locks.lock("g", "c", [Q0]) == [Q0]  # at once, no expiry to wait for
    assert locks.unlock("nobody", "a", [Q0]) == 0


def test_nothing_is_granted_for_a_lease_after_a_start() -> None:
    clock = Clock()
    locks = manager(clock, grace=True)
    assert locks.in_grace()
    assert locks.lock("g", "a", [Q0]) == []
    clock.now_ms += LIVE_MS
    assert locks.in_grace()  # a lease granted just before the start may still be live
    clock.now_ms += 1
    assert not locks.in_grace()
    assert locks.lock("g", "a", [Q0]) == [Q0]


def test_the_bound_drops_expired_leases_first() -> None:
    clock = Clock()
    locks = manager(clock, max_locks=2)
    assert locks.lock("g", "a", [Q0, Q1]) == [Q0, Q1]
    with pytest.raises(TooManyLocks, match="MAX_QUEUE_LOCKS = 2"):
        locks.lock("g", "a", [("T", 2)])
    assert locks.lock("g", "a", [Q0]) == [Q0]  # a renewal takes no room
    clock.now_ms += LIVE_MS + 1
    assert locks.lock("h", "b", [("T", 2)]) == [("T", 2)]  # expired ones made room
    assert locks.holder("h", "T", 2) == "b"  # in the table (a new group, made room for)


def test_handovers_are_counted_by_how_the_last_holder_let_go() -> None:
    clock = Clock()
    locks = manager(clock)
    assert locks.lock("g", "a", [Q0, Q1]) == [Q0, Q1]
    assert locks.lock("g", "a", [Q0]) == [Q0]  # a renewal: no hand-over
    assert locks.unlock("g", "a", [Q0]) == 1
    assert locks.unlock("g", "a", [Q0]) == 0  # released once
    assert locks.held() == 1
    assert locks.lock("g", "a", [Q0]) == [Q0]  # its own queue again: no hand-over
    assert locks.handovers == {"released": 0, "expired": 0}
    locks.unlock("g", "a", [Q0])
    assert locks.lock("g", "b", [Q0]) == [Q0]  # a rebalance
    clock.now_ms += LIVE_MS + 1
    assert locks.lock("g", "c", [Q1]) == [Q1]  # a's lease on Q1 expired
    assert locks.handovers == {"released": 1, "expired": 1}
    assert [(v.queue_id, v.client_id) for v in locks.locks("g")] == [(1, "c")]


def test_released_leases_give_their_room_to_new_ones() -> None:
    clock = Clock()
    locks = manager(clock, max_locks=2)
    locks.lock("g", "a", [Q0, Q1])
    locks.unlock("g", "a", [Q0, Q1])  # kept, marked released
    assert locks.lock("h", "b", [("T", 2), ("T", 3)]) == [("T", 2), ("T", 3)]
    assert locks.held() == 2

"""The transaction service's bookkeeping (transaction/state.py): its bounds, and what
happens past them."""

from __future__ import annotations

import grpc
import pytest

from services.dispatch.transaction.state import (
    HALVES_MAX,
    RESOLVED_MAX,
    HalfInfo,
    TransactionState,
)
from tide.server import ServiceError


def half(group: str = "PG") -> HalfInfo:
    return HalfInfo(0, 100, group, 1, 1)


def test_the_bounds_are_named_and_the_defaults() -> None:
    state = TransactionState()
    assert (state.halves_max, state.resolved_max) == (HALVES_MAX, RESOLVED_MAX)
    assert 0 < HALVES_MAX <= RESOLVED_MAX


def test_halves_full_at_the_bound() -> None:
    state = TransactionState(halves_max=2)
    state.halves[0] = half()
    assert not state.halves_full()
    state.halves[1] = half()
    assert state.halves_full()
    state.resolve(0, "commit")
    assert not state.halves_full()


def test_past_resolved_max_a_resolution_above_the_oldest_open_half_is_refused() -> None:
    state = TransactionState(resolved_max=2)
    state.halves[0] = half()  # the oldest open half: resolutions above it are held
    state.resolve(1, "commit")
    state.resolve(2, "rollback")
    assert len(state.resolved) == 2
    with pytest.raises(ServiceError) as info:
        state.check_room(3)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queue offset 0" in info.value.message and "RESOLVED_MAX (2)" in info.value.message
    state.check_room(0)  # resolving the oldest itself is always allowed: it frees the rest
    state.resolve(0, "discard")
    assert (state.check_from, state.resolved) == (3, {})
    state.check_room(3)
    assert state.resolution(1) == "" and state.resolution(3) is None


def test_a_group_with_nothing_due_is_not_held() -> None:
    state = TransactionState()
    state.due["PG"] = {4, 2}
    assert state.take_checks("PG", 1) == [2]
    assert state.take_checks("PG", 5) == [4]
    assert "PG" not in state.due
    assert state.take_checks("PG", 5) == []

"""ByteBudget (tide/server/_byte_budget.py): refusal past the limit naming it, and the
wait below it that a stream's reader uses (backpressure)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tide.server import ByteBudget, ServiceError


def test_take_refuses_past_the_limit_naming_it_and_give_frees() -> None:
    budget = ByteBudget("max_x_bytes", 100, "x requests in flight")
    budget.take(60)
    with pytest.raises(ServiceError) as info:
        budget.take(41)
    assert info.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_x_bytes (100 bytes) reached: 60 bytes of x requests in flight" in info.value.message
    assert "this request is 41 bytes; retry later" in info.value.message
    budget.take(40)
    assert budget.in_use_bytes == 100 and budget.peak_bytes == 100 and budget.refused == 1
    budget.give(100)
    assert budget.in_use_bytes == 0 and budget.peak_bytes == 100


def test_a_request_larger_than_the_limit_alone_is_refused() -> None:
    budget = ByteBudget("max_x_bytes", 100, "x requests")
    with pytest.raises(ServiceError, match="more than max_x_bytes"):
        budget.take(101)
    with budget.held(100):
        assert budget.in_use_bytes == 100
    assert budget.in_use_bytes == 0


def test_wait_below_returns_once_bytes_are_given_back() -> None:
    async def run() -> list[str]:
        budget = ByteBudget("max_x_bytes", 100, "x")
        events: list[str] = []
        budget.force(150)  # a stream's request read at the limit: counted, past it

        async def reader() -> None:
            await budget.wait_below()
            events.append("read")

        task = asyncio.create_task(reader())
        await asyncio.sleep(0)
        assert not task.done()
        budget.give(40)  # 110: still at or over the limit
        await asyncio.sleep(0)
        assert not task.done()
        events.append("freed")
        budget.give(20)  # 90: below
        await asyncio.wait_for(task, 5)
        return events

    assert asyncio.run(run()) == ["freed", "read"]


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        ByteBudget("max_x_bytes", 0, "x")

"""The POP service's in-memory parts without processes: acks of many calls share one
Append (handles.py), and a FIFO queue moved back to its oldest message in flight
(state.py)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import grpc
import pytest

from services.dispatch.pop.handles import PopHandles
from services.dispatch.pop.service import PopService
from services.dispatch.pop.state import PopState
from services.dispatch.storage_client import AppendedRun
from tide.format import PopCheckpoint
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as pb

NOW_MS = 1_000_000


def checkpoint(queue_offset: int, *, fifo: bool = False) -> PopCheckpoint:
    return PopCheckpoint(
        "G", "T", 0, queue_offset, 100 * queue_offset, 90, 1, NOW_MS + 60_000, fifo, "T"
    )


class FakeService:
    """What PopHandles uses of a PopService; its Appends wait for ``release``."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.state = PopState(checkpoints_max=1_000)
        self.appends: list[int] = []
        self.release = asyncio.Event()

    def clock_ms(self) -> int:
        return NOW_MS

    async def ready(self) -> None:
        return None

    async def append(self, run: bytes, count: int) -> AppendedRun:
        self.appends.append(count)
        await self.release.wait()
        return AppendedRun(count, NOW_MS, tuple(range(count)), tuple(range(count)))


def ack_request(*offsets: int) -> pb.PopAckRequest:
    entries = [pb.PopAckEntry(checkpoint_offset=o, queue_id=0, queue_offset=o) for o in offsets]
    return pb.PopAckRequest(consumer_group="G", topic="T", entries=entries)


def test_acks_of_calls_waiting_share_one_append() -> None:
    async def run() -> None:
        fake = FakeService()
        for offset in range(11):
            fake.state.add(offset, checkpoint(offset))
        handles = PopHandles(cast(PopService, cast(Any, fake)))
        first = asyncio.create_task(handles.ack(ack_request(0)))
        while not fake.appends:  # the first call's Append is in flight
            await asyncio.sleep(0)
        others = [asyncio.create_task(handles.ack(ack_request(o))) for o in range(1, 11)]
        await asyncio.sleep(0)
        fake.release.set()
        answers = await asyncio.gather(first, *others)
        assert fake.appends == [1, 10]  # the ten calls that waited: one Append
        assert all(a.results[0].code == 0 for a in answers)
        assert not fake.state.held
        again = await handles.ack(ack_request(3))
        assert again.results[0].code == 5  # NOT_FOUND: acked already

    asyncio.run(run())


def test_an_ack_of_another_group_or_position_is_refused_per_entry() -> None:
    async def run() -> None:
        fake = FakeService()
        fake.release.set()
        fake.state.add(7, checkpoint(7))
        handles = PopHandles(cast(PopService, cast(Any, fake)))
        wrong_group = pb.PopAckRequest(
            consumer_group="H",
            topic="T",
            entries=[pb.PopAckEntry(checkpoint_offset=7, queue_offset=7)],
        )
        answer = await handles.ack(wrong_group)
        assert answer.results[0].code == 3 and "not one of group" in answer.results[0].message
        assert fake.appends == [] and 7 in fake.state.held

    asyncio.run(run())


def test_a_fifo_queue_goes_back_to_its_oldest_message_in_flight() -> None:
    state = PopState(checkpoints_max=100)
    for revive_offset, queue_offset in ((10, 4), (11, 5), (12, 6)):
        state.add(revive_offset, checkpoint(queue_offset, fifo=True))
    state.advance(("G", "T", 0), 7)
    state.resolve(11)  # acked: skipped when the queue is read again
    state.fifo_acked.setdefault(("G", "T", 0), set()).add(5)
    assert state.fifo_expired(("G", "T", 0)) == [10, 12]
    assert state.next[("G", "T", 0)] == 4
    assert state.fifo_attempts[(("G", "T", 0), 4)] == 1
    assert state.inflight(("G", "T", 0)) == 0
    assert state.progress() == 13  # nothing held: past everything known


def test_the_checkpoint_limit_is_refused_with_its_option() -> None:
    state = PopState(checkpoints_max=1)
    state.add(0, checkpoint(0))
    with pytest.raises(ServiceError, match="--pop-checkpoints-max 1"):
        state.check_room(1)


def test_a_failed_append_fails_every_call_of_its_run_and_resolves_nothing() -> None:
    async def run() -> None:
        fake = FakeService()
        for offset in range(3):
            fake.state.add(offset, checkpoint(offset))
        handles = PopHandles(cast(PopService, cast(Any, fake)))
        first = asyncio.create_task(handles.ack(ack_request(0)))
        while not fake.appends:
            await asyncio.sleep(0)
        others = [asyncio.create_task(handles.ack(ack_request(o))) for o in (1, 2)]
        await asyncio.sleep(0)

        async def refuse(run: bytes, count: int) -> AppendedRun:
            fake.appends.append(count)
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "storage: down")

        fake.append = refuse  # type: ignore[method-assign]
        fake.release.set()
        assert (await first).results[0].code == 0
        for task in others:
            with pytest.raises(ServiceError, match="storage: down"):
                await task
        assert fake.appends == [1, 2]
        assert sorted(fake.state.held) == [1, 2]  # still waiting for an ack

    asyncio.run(run())

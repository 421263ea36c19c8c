"""The writer thread, and which batches the dispatcher applies on the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Iterable
from types import TracebackType
from typing import Any, cast

import pytest

from services.dispatch import dispatcher as dispatcher_module
from services.dispatch.arrivals import ArrivalHub
from services.dispatch.dispatcher import INLINE_APPLY_MAX_RECORDS, Dispatcher, Writer
from services.dispatch.engine.dispatch_store import Arrival, DispatchStore
from services.dispatch.storage_client import StorageClient
from tide.tail import RecordBatch
from tide.tail.follower import TailFollower
from tide.waiting import wait_until_async


def run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 10))  # type: ignore[arg-type]


def test_writer_is_idle_only_with_nothing_queued_or_running() -> None:
    async def scenario() -> None:
        writer = Writer()
        gate = threading.Event()
        assert writer.idle
        first = asyncio.ensure_future(writer.run(gate.wait, 5))
        second = asyncio.ensure_future(writer.run(threading.get_ident))
        await wait_until_async(lambda: not writer.idle, "the calls submitted", 5.0)
        assert not writer.idle  # the first runs, the second is queued
        gate.set()
        assert await first is True
        assert not first.exception()
        assert await second != threading.get_ident()  # on the writer thread
        assert writer.idle
        failing = writer.run(lambda: 1 // 0)
        with pytest.raises(ZeroDivisionError):
            await failing
        assert writer.idle  # counted as finished when it raises too
        writer.shutdown()

    run(scenario())


class _Store:
    """Records the thread of each apply; the writer is held busy by ``hold``."""

    def __init__(self) -> None:
        self.threads: list[tuple[int, int]] = []  # (records, thread id)
        self.dispatched_offset = 0

    def apply(self, batch: RecordBatch) -> list[Arrival]:
        self.threads.append((len(batch), threading.get_ident()))
        self.dispatched_offset = batch.end_offset
        return [Arrival("t", 0, len(self.threads))]


class _Follower:
    """Yields the given batches, calling ``between`` before each."""

    def __init__(self, batches: list[RecordBatch], between: Any) -> None:
        self._batches = batches
        self._between = between
        self.reconnects = 0
        self.max_offset: int | None = None
        self.next_offset = 0

    async def __aenter__(self) -> _Follower:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass

    async def batches(self) -> AsyncGenerator[RecordBatch, None]:
        for index, batch in enumerate(self._batches):
            await self._between(index)
            yield batch


class _Hub(ArrivalHub):
    def __init__(self) -> None:
        super().__init__()
        self.published: list[list[Arrival]] = []

    def publish(self, arrivals: Iterable[Arrival]) -> None:
        self.published.append(list(arrivals))
        super().publish(arrivals)


def _batch(first: int, count: int) -> RecordBatch:
    offsets = list(range(first, first + count * 100, 100))
    zeros = [0] * count
    return RecordBatch(
        b"",
        positions=zeros,
        offsets=offsets,
        sizes=[100] * count,
        queue_ids=zeros,
        queue_offsets=zeros,
        sys_flags=zeros,
        store_timestamps=zeros,
        topics=["t"] * count,
        props_starts=zeros,
    )


def _dispatcher(
    store: _Store, hub: _Hub, writer: Writer, batches: list[RecordBatch], between: Any
) -> Dispatcher:
    class _Dispatcher(Dispatcher):
        def new_follower(self, offset: int) -> TailFollower:
            return cast(TailFollower, _Follower(batches, between))

    return _Dispatcher(
        cast(DispatchStore, store),
        cast(StorageClient, object()),
        hub,
        writer,
        cleanup_interval_s=3600,
    )


def test_batches_are_applied_on_the_loop_while_the_writer_is_idle() -> None:
    async def scenario() -> None:
        loop_thread = threading.get_ident()
        writer = Writer()
        store = _Store()
        hub = _Hub()
        busy = threading.Event()
        big = INLINE_APPLY_MAX_RECORDS + 1
        batches = [_batch(0, 1), _batch(100, big), _batch(100 * (big + 1), 2), _batch(10**6, 3)]
        pending: list[asyncio.Future[object]] = []

        async def between(index: int) -> None:
            if index == 2:  # the writer is busy with something else: queue behind it
                pending.append(asyncio.ensure_future(writer.run(busy.wait, 5)))
                await wait_until_async(lambda: not writer.idle, "the writer busy", 5.0)
                # Deliberately lets time pass: the writer stays busy while the batch
                # queues behind it (the dispatcher decides without awaiting meanwhile).
                asyncio.get_running_loop().call_later(0.05, busy.set)

        dispatcher = _dispatcher(store, hub, writer, batches, between)
        assert await dispatcher._follow_once(0) is None
        await asyncio.gather(*pending)
        # 1 record, writer idle: the loop; over the slice size: the loop, in two slices;
        # writer busy: the writer (after its queued work); idle again: the loop.
        assert [(count, thread == loop_thread) for count, thread in store.threads] == [
            (1, True),
            (INLINE_APPLY_MAX_RECORDS, True),
            (1, True),
            (2, False),
            (3, True),
        ]
        assert hub.published == [[Arrival("t", 0, n)] for n in (1, 2, 3, 4, 5)]
        writer.shutdown()

    run(scenario())


def test_the_rest_of_a_batch_queues_behind_work_given_to_the_writer_meanwhile() -> None:
    """Between two slices of a batch the loop runs other tasks: when one gives the writer
    thread work, the rest of the batch is applied on the writer thread, after it."""

    async def scenario() -> None:
        loop_thread = threading.get_ident()
        writer = Writer()
        store = _Store()
        hub = _Hub()
        order: list[str] = []
        count = 2 * INLINE_APPLY_MAX_RECORDS + 5
        batch = _batch(0, count)

        gate = threading.Event()

        def cleanup() -> None:
            gate.wait(5)
            order.append(f"cleanup after {len(store.threads)} applies")

        async def between(index: int) -> None:
            async def sneak_in() -> None:  # first runs when the first slice yields
                asyncio.get_running_loop().call_later(0.05, gate.set)
                await writer.run(cleanup)

            pending.append(asyncio.ensure_future(sneak_in()))

        pending: list[asyncio.Future[None]] = []
        dispatcher = _dispatcher(store, hub, writer, [batch], between)
        assert await dispatcher._follow_once(0) is None
        await asyncio.gather(*pending)
        threads = [(n, thread == loop_thread) for n, thread in store.threads]
        assert threads == [
            (INLINE_APPLY_MAX_RECORDS, True),
            (count - INLINE_APPLY_MAX_RECORDS, False),
        ]
        assert order == ["cleanup after 1 applies"]
        assert store.dispatched_offset == batch.end_offset
        writer.shutdown()

    run(scenario())


def test_the_tail_asks_for_large_chunks() -> None:
    hub = ArrivalHub()
    dispatcher = Dispatcher(
        cast(DispatchStore, _Store()),
        cast(StorageClient, type("S", (), {"target": "127.0.0.1:1"})()),
        hub,
        Writer(),
        cleanup_interval_s=3600,
    )
    follower = dispatcher.new_follower(0)
    assert follower._max_chunk_bytes == dispatcher_module.TAIL_CHUNK_BYTES >= 1 << 20

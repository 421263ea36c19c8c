"""The master's side of ``Replicate`` (RocketMQ's HAConnection: its ReadSocketService is
the ack task here, its WriteSocketService the stream loop).

Per slave stream: check the hello, pick the start offset, then send the commitlog as it
is in the files (``CommitLog.read_raw``: bounded chunks that never cross a segment end)
while a task reads the slave's acks and feeds the SYNC_MASTER waiter. Bounded: at most
``MAX_SLAVES`` streams; a stream silent for ``IDLE_HEARTBEATS`` heartbeat intervals ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import grpc

from services.storage.cold_reads import read_chunk
from services.storage.engine.commitlog import OffsetBelowMinError
from services.storage.engine.ha_ack_waiter import SlaveAckWaiter
from services.storage.engine.ha_replica_writer import tail_range
from services.storage.engine.message_store import MessageStore
from services.storage.replication.settings import MAX_SLAVES, ReplicationSettings
from tide.quoting import quote
from tide.server import ColdReads, ServiceError
from tide.v1 import storage_pb2 as pb

log = logging.getLogger("tide.storage.replication.master")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class SlaveLink:
    """One connected slave, as the master sees it."""

    peer: str
    broker_id: int
    ack_offset: int
    connected_at_ms: int = field(default_factory=_now_ms)
    last_ack_at_ms: int = field(default_factory=_now_ms)
    # When an ack last reached the master's max offset (at connect: the connect time).
    caught_up_at_s: float = field(default_factory=time.monotonic)

    def on_ack(self, offset: int, master_max_offset: int) -> None:
        self.ack_offset = max(self.ack_offset, offset)
        self.last_ack_at_ms = _now_ms()
        if self.ack_offset >= master_max_offset:
            self.caught_up_at_s = time.monotonic()

    def status(self, master_max_offset: int) -> pb.SlaveStatus:
        lag_bytes = max(0, master_max_offset - self.ack_offset)
        lag_s = time.monotonic() - self.caught_up_at_s if lag_bytes else 0.0
        return pb.SlaveStatus(
            peer=self.peer,
            broker_id=self.broker_id,
            ack_offset=self.ack_offset,
            lag_bytes=lag_bytes,
            lag_seconds=lag_s,
            connected_at_ms=self.connected_at_ms,
            last_ack_at_ms=self.last_ack_at_ms,
        )


def _refuse(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, message)


class ReplicationMaster:
    def __init__(
        self,
        store: MessageStore,
        settings: ReplicationSettings,
        waiter: SlaveAckWaiter,
        cold_reads: ColdReads,
    ) -> None:
        self._store = store
        self._cold_reads = cold_reads  # a slave far behind reads what is not in memory
        self._settings = settings
        self.waiter = waiter
        self.links: list[SlaveLink] = []
        self._draining = asyncio.Event()

    def drain(self) -> None:
        """End every stream (shutdown); slaves reconnect once the master is back."""
        self._draining.set()

    async def serve(
        self,
        requests: AsyncIterator[pb.ReplicateRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[pb.ReplicateChunk]:
        store = self._store
        hello = await self._hello(requests)
        start = self._start_offset(hello)
        if len(self.links) >= MAX_SLAVES:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this master serves {MAX_SLAVES} slaves already; stop one first",
            )
        link = SlaveLink(context.peer(), hello.broker_id, min(start, hello.max_offset))
        self.links = [*self.links, link]
        self.waiter.slave_connected()
        self.waiter.ack(link.ack_offset)
        log.info(
            "slave id %d at %s connected (its max offset %d); streaming from %d",
            hello.broker_id,
            link.peer,
            hello.max_offset,
            start,
        )
        arrived = asyncio.Event()
        wake = _waker(arrived)
        store.commitlog.add_listener(wake)
        acks = asyncio.ensure_future(self._read_acks(requests, link))
        try:
            yield self._chunk(start, b"")
            async for chunk in self._stream(start, arrived, acks):
                yield chunk
            if acks.done() and not acks.cancelled():
                acks.result()  # raises what ended the ack reader (e.g. no ack in time)
        finally:
            acks.cancel()
            store.commitlog.remove_listener(wake)
            self.links = [x for x in self.links if x is not link]
            self.waiter.slave_disconnected()
            log.info(
                "slave id %d at %s disconnected (acked %d)",
                link.broker_id,
                link.peer,
                link.ack_offset,
            )

    async def _stream(
        self, offset: int, arrived: asyncio.Event, acks: asyncio.Future[None]
    ) -> AsyncIterator[pb.ReplicateChunk]:
        commitlog, batch_bytes = self._store.commitlog, self._settings.batch_bytes
        heartbeat_s = self._settings.heartbeat_s
        last_sent_s = time.monotonic()
        while not self._draining.is_set() and not acks.done():
            arrived.clear()
            try:
                read = partial(commitlog.read_raw, offset, batch_bytes)
                _, data = await read_chunk(self._cold_reads, commitlog, offset, batch_bytes, read)
            except OffsetBelowMinError as exc:
                raise ServiceError(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"{exc}: retention deleted what the slave still needs; it must start "
                    "over from an empty store directory",
                ) from exc
            now_s = time.monotonic()
            if data:
                yield self._chunk(offset, data)
                offset += len(data)
                last_sent_s = now_s
                continue
            if now_s - last_sent_s >= heartbeat_s:
                yield self._chunk(offset, b"")  # heartbeat: the master is alive
                last_sent_s = now_s
            await _wait_first(
                (arrived.wait(), self._draining.wait()),
                acks,
                heartbeat_s - (now_s - last_sent_s),
            )

    def _chunk(self, offset: int, data: bytes) -> pb.ReplicateChunk:
        segments = self._store.segments
        return pb.ReplicateChunk(
            offset=offset,
            data=data,
            master_max_offset=segments.max_offset,
            master_min_offset=segments.min_offset,
        )

    async def _hello(self, requests: AsyncIterator[pb.ReplicateRequest]) -> pb.ReplicateRequest:
        settings = self._settings
        try:
            hello = await asyncio.wait_for(anext(requests), settings.idle_timeout_s)
        except TimeoutError as exc:
            raise ServiceError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no hello within {settings.idle_timeout_s:.0f} s: send ReplicateRequest "
                "with broker_name, broker_id, segment_size_bytes and max_offset first",
            ) from exc
        if hello.broker_name != settings.broker_name:
            raise _refuse(
                f"the slave says broker name {quote(hello.broker_name)}; this master is "
                f"{quote(settings.broker_name)}: start the slave with --broker-name "
                f"{settings.broker_name}"
            )
        if hello.broker_id <= 0:
            raise _refuse(f"a slave has a broker id > 0 (got {hello.broker_id})")
        size = self._store.config.segment_size_bytes
        if hello.segment_size_bytes != size:
            raise _refuse(
                f"the slave's segments are {hello.segment_size_bytes} bytes, the master's "
                f"{size}: start the slave with --segment-size-bytes {size}"
            )
        if hello.max_offset < 0:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "max_offset must be >= 0")
        return hello

    def _start_offset(self, hello: pb.ReplicateRequest) -> int:
        """The slave's max offset; the master's max when the slave holds more (it
        truncates); the master's min when the slave holds nothing the master has."""
        segments = self._store.segments
        master_min, master_max = segments.min_offset, segments.max_offset
        slave_max = hello.max_offset
        if slave_max > master_max:
            return master_max
        if slave_max < master_min:
            return master_min
        check_from = hello.tail_check_offset
        expected = tail_range(slave_max, self._store.config.segment_size_bytes)
        if check_from not in (expected, slave_max):
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"tail_check_offset {check_from} should be {expected} for max offset {slave_max}",
            )
        if master_min <= check_from < slave_max:
            _, data = self._store.commitlog.read_raw(check_from, slave_max - check_from)
            if len(data) != slave_max - check_from or zlib.crc32(data) != hello.tail_crc32:
                raise _refuse(
                    f"the slave's bytes [{check_from}, {slave_max}) differ from the master's: "
                    "its commitlog diverged from this master's (a master that lost a "
                    "replicated tail, or another master); stop the slave, empty its "
                    "--store-dir and start it again"
                )
        return slave_max

    async def _read_acks(
        self, requests: AsyncIterator[pb.ReplicateRequest], link: SlaveLink
    ) -> None:
        idle_s = self._settings.idle_timeout_s
        segments = self._store.segments
        while True:
            try:
                request = await asyncio.wait_for(anext(requests), idle_s)
            except StopAsyncIteration:
                return  # the slave closed its side
            except TimeoutError as exc:
                log.warning(
                    "no ack from slave id %d at %s for %.0f s: ending its stream",
                    link.broker_id,
                    link.peer,
                    idle_s,
                )
                raise ServiceError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"no ack for {idle_s:.0f} s; reconnect when running again",
                ) from exc
            link.on_ack(request.max_offset, segments.max_offset)
            self.waiter.ack(request.max_offset)

    def status(self) -> pb.ReplicationStatus:
        master_max = self._store.segments.max_offset
        return pb.ReplicationStatus(
            role=self._settings.role.value,
            broker_id=self._settings.broker_id,
            slaves=[link.status(master_max) for link in self.links],
            slave_ack_offset=self.waiter.ack_offset,
        )


def _waker(event: asyncio.Event) -> Callable[[int], None]:
    """An append listener that sets ``event`` from any thread."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()

    def wake(_: int) -> None:
        if threading.get_ident() == loop_thread:
            event.set()
        else:
            loop.call_soon_threadsafe(event.set)

    return wake


async def _wait_first(
    waits: tuple[Coroutine[Any, Any, Any], ...], task: asyncio.Future[None], timeout_s: float
) -> None:
    """Until an awaitable in ``waits`` or ``task`` completes, or ``timeout_s`` passes;
    never cancels ``task``."""
    waiters = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(
            [*waiters, task], timeout=max(0.0, timeout_s), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for waiter in waiters:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter

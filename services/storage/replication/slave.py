"""The slave's replication task (RocketMQ's HAClient): one ``Replicate`` stream to the
master at a time, reconnected with backoff after either side restarts.

A session: hello (identity, segment size, max offset, tail CRC), the master's first
answer says where the stream starts (truncate to it if this slave holds more), then
chunks are written at their offsets and acked: after every write (coalesced: the ack
carries the latest max offset) and at least every heartbeat interval. No chunk or
heartbeat from the master for ``IDLE_HEARTBEATS`` intervals ends the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import grpc

from services.storage.engine.errors import DiskFullError
from services.storage.engine.ha_replica_writer import ReplicationError, ReplicaWriter
from services.storage.replication.settings import ReplicationSettings
from tide.server import cluster_channel_interceptors
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

log = logging.getLogger("tide.storage.replication.slave")
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 10.0
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)


class SlaveReplicator:
    def __init__(
        self, writer: ReplicaWriter, settings: ReplicationSettings, segment_size_bytes: int
    ) -> None:
        self._writer = writer
        self._settings = settings
        self._segment_size_bytes = segment_size_bytes
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.failures = 0
        self.sessions = 0
        self.master_max_offset = 0
        # When this slave last had everything the master had (lag seconds count from it).
        self._caught_up_at_s = time.monotonic()
        # Set after the first handshake (or the first failure): the service waits for it
        # (bounded) before it serves, so a truncation happens before a dispatch tails.
        self.first_attempt_done = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="storage.replication.slave")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        master = self._settings.master_address
        while True:
            try:
                await self._session()
                log.info("master %s ended the replication stream; reconnecting", master)
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "replication from master %s failed (attempt %d): %s: %s",
                    master,
                    self.failures + 1,
                    exc.code().name,
                    exc.details(),
                )
            except (ReplicationError, TimeoutError, DiskFullError) as exc:
                # (a full disk: the next segment cannot be created; retried like the rest,
                # so the slave catches up by itself once space is freed)
                log.error(
                    "replication from master %s stopped (attempt %d): %s",
                    master,
                    self.failures + 1,
                    exc or "no message from the master in time",
                )
            self.connected = False
            self.failures += 1
            self.first_attempt_done.set()
            await asyncio.sleep(min(MAX_RETRY_S, FIRST_RETRY_S * 2 ** min(self.failures - 1, 8)))

    async def _session(self) -> None:
        settings, writer = self._settings, self._writer
        ack_wanted = asyncio.Event()
        check_offset, crc = writer.tail_check()
        hello = pb.ReplicateRequest(
            broker_name=settings.broker_name,
            broker_id=settings.broker_id,
            segment_size_bytes=self._segment_size_bytes,
            tail_check_offset=check_offset,
            tail_crc32=crc,
            max_offset=writer.max_offset,
        )

        async def requests() -> AsyncIterator[pb.ReplicateRequest]:
            yield hello
            while True:
                with contextlib.suppress(TimeoutError):  # the heartbeat timer
                    await asyncio.wait_for(ack_wanted.wait(), settings.heartbeat_s)
                ack_wanted.clear()
                yield pb.ReplicateRequest(max_offset=writer.max_offset)

        async with grpc.aio.insecure_channel(
            settings.master_address,
            options=CHANNEL_OPTIONS,
            interceptors=cluster_channel_interceptors() or None,
        ) as channel:
            call = pb_grpc.StorageStub(channel).Replicate(requests())
            try:
                first = await asyncio.wait_for(call.read(), settings.idle_timeout_s)
                if first is _EOF:
                    return
                assert isinstance(first, pb.ReplicateChunk)
                writer.begin(first.offset, settings.master_address)
                self._note(first.master_max_offset)
                self.connected, self.failures = True, 0
                self.first_attempt_done.set()
                self.sessions += 1
                log.info(
                    "replicating from master %s at offset %d (master max offset %d)",
                    settings.master_address,
                    first.offset,
                    first.master_max_offset,
                )
                while True:
                    chunk = await asyncio.wait_for(call.read(), settings.idle_timeout_s)
                    if chunk is _EOF:
                        return
                    assert isinstance(chunk, pb.ReplicateChunk)
                    if chunk.data:
                        writer.write(chunk.offset, chunk.data)
                        ack_wanted.set()
                    self._note(chunk.master_max_offset)
            finally:
                call.cancel()

    def _note(self, master_max_offset: int) -> None:
        self.master_max_offset = master_max_offset
        if self._writer.max_offset >= master_max_offset:
            self._caught_up_at_s = time.monotonic()

    def status(self) -> pb.ReplicationStatus:
        lag_bytes = max(0, self.master_max_offset - self._writer.max_offset)
        return pb.ReplicationStatus(
            role=self._settings.role.value,
            broker_id=self._settings.broker_id,
            master_address=self._settings.master_address,
            master_connected=self.connected,
            master_max_offset=self.master_max_offset,
            lag_bytes=lag_bytes,
            lag_seconds=time.monotonic() - self._caught_up_at_s if lag_bytes else 0.0,
        )

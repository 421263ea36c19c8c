"""This storage's replication role, as the servicer and the service see it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import Future

import grpc

from services.storage.engine.ha_ack_waiter import ReplicaOutcome, SlaveAckWaiter
from services.storage.engine.ha_replica_writer import ReplicaWriter
from services.storage.engine.message_store import MessageStore
from services.storage.replication.master import ReplicationMaster
from services.storage.replication.metadata_sync import MetadataSync
from services.storage.replication.settings import BrokerRole, ReplicationSettings
from services.storage.replication.slave import SlaveReplicator
from tide.server import ColdReads, ServiceError
from tide.v1 import storage_pb2 as pb

FIRST_HANDSHAKE_WAIT_S = 5.0


class Replication:
    """A master (serves ``Replicate``; a SYNC_MASTER's appends wait for acks) or a slave
    (copies its master; refuses appends and topic changes)."""

    def __init__(
        self,
        store: MessageStore,
        settings: ReplicationSettings,
        cold_reads: ColdReads,
    ) -> None:
        self.settings = settings
        self.master: ReplicationMaster | None = None
        self.slave: SlaveReplicator | None = None
        self.metadata_sync: MetadataSync | None = None
        self.slave_refusal = ""
        if settings.role is BrokerRole.SLAVE:
            self.slave_refusal = (
                f"this storage is a slave of {settings.master_address}; produce to the master"
            )
            store.refuse_puts(self.slave_refusal)
            self.slave = SlaveReplicator(
                ReplicaWriter(store), settings, store.config.segment_size_bytes
            )
            self.metadata_sync = MetadataSync(
                store.metadata, settings.master_address, settings.metadata_sync_interval_ms
            )
        else:
            waiter = SlaveAckWaiter(
                max_gap_bytes=settings.max_gap_bytes, timeout_ms=settings.sync_slave_timeout_ms
            )
            self.master = ReplicationMaster(store, settings, waiter, cold_reads)
            if settings.role is BrokerRole.SYNC_MASTER:
                store.ha_waiter = waiter

    async def start(self) -> None:
        """A slave starts replicating and waits (at most ``FIRST_HANDSHAKE_WAIT_S``) for
        its first handshake, so that a truncation to the master's end happens before the
        service serves (and a dispatch tails it)."""
        if self.slave is not None:
            self.slave.start()
            if self.metadata_sync is not None:
                self.metadata_sync.start()
            with contextlib.suppress(TimeoutError):  # the master is not up: serve anyway
                await asyncio.wait_for(self.slave.first_attempt_done.wait(), FIRST_HANDSHAKE_WAIT_S)

    def drain(self) -> None:
        if self.master is not None:
            self.master.drain()

    async def stop(self) -> None:
        if self.metadata_sync is not None:
            await self.metadata_sync.stop()
        if self.slave is not None:
            await self.slave.stop()
        if self.master is not None:
            self.master.waiter.close()

    def check_topic_change(self) -> None:
        self.check_metadata_change("change topics")

    def check_metadata_change(self, what: str) -> None:
        """FAILED_PRECONDITION on a slave: its topics, consumer offsets, group configs and
        delivery progress are its master's copies (metadata_sync.py), changed there only.
        ``what``: the fix, e.g. "commit offsets"."""
        if self.slave is not None:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this storage is a slave of {self.settings.master_address}; {what} on the master",
            )

    def check_master(self, what: str) -> None:
        """FAILED_PRECONDITION on a slave for what only a master serves."""
        if self.slave is not None:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this storage is a slave of {self.settings.master_address}, not a master: {what}",
            )

    def serve(
        self,
        requests: AsyncIterator[pb.ReplicateRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[pb.ReplicateChunk]:
        if self.master is None:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this storage is a slave of {self.settings.master_address}, not a master: "
                "point the slave's --master at the master",
            )
        return self.master.serve(requests, context)

    def status(self) -> pb.ReplicationStatus:
        if self.slave is not None:
            status = self.slave.status()
            sync = self.metadata_sync
            if sync is not None:
                status.metadata_synced_at_ms = sync.synced_at_ms
                status.metadata_sync_error = sync.last_error
            return status
        assert self.master is not None
        return self.master.status()


async def wait_replicated(
    replicated: Future[ReplicaOutcome],
    status: pb.AppendStatus.ValueType,
    store: MessageStore,
) -> pb.AppendStatus.ValueType:
    """SYNC_MASTER: PUT_OK once a slave acknowledged; FLUSH_SLAVE_TIMEOUT after
    ``timeout_s``; SLAVE_NOT_AVAILABLE without a slave in sync. A flush that already
    timed out (FLUSH_DISK_TIMEOUT) is reported as such without waiting."""
    if status != pb.PUT_OK:
        replicated.cancel()
        return status
    if not replicated.done():
        timeout_s = store.ha_waiter.timeout_s if store.ha_waiter is not None else 0.0
        try:
            await asyncio.wait_for(asyncio.wrap_future(replicated), timeout_s)
        except TimeoutError:
            return pb.FLUSH_SLAVE_TIMEOUT  # wait_for cancelled the future: the waiter drops it
    if replicated.result() is ReplicaOutcome.NOT_AVAILABLE:
        return pb.SLAVE_NOT_AVAILABLE
    return pb.PUT_OK

"""The dispatch service's client of the storage service: GetStatus, Read, and for the
delivery and transaction services (services/dispatch/delivery/, transaction/) Append and
SaveDeliveryProgress.

One class, three instances in a dispatch (service.py): one for the dispatcher and the
reads it serves, one for the delivery services, one for the transaction service. (The
commitlog itself is followed by ``tide.tail.follower.TailFollower``, on channels of its own.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tide.limits import READ_MAX_POSITIONS
from tide.server import ANSWER_FRAMING_BYTES, MAX_MESSAGE_BYTES, traced_channel
from tide.tail import Backoff
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

log = logging.getLogger("tide.dispatch.storage")

# The storage service's Read limits: 1024 positions and 64 MiB a call.
READ_MAX_BYTES = 32 * 1024 * 1024  # half the server's limit: the reply adds fields
RPC_TIMEOUT_S = 10.0
# An Append waits for the store's flush (and SYNC_MASTER's replica): allow for both.
APPEND_TIMEOUT_S = 30.0
STATUS_TIMEOUT_S = 5.0
# A progress copy only serves slaves: it must not hold the service that sends it for long.
PROGRESS_TIMEOUT_S = 5.0
# While the storage does not answer: one warning, then a reminder this often.
WAIT_LOG_INTERVAL_S = 30.0
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES + ANSWER_FRAMING_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Reconnect soon after the storage comes back, not after gRPC's default backoff
    # (which grows to two minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)

Position = tuple[int, int]  # (physical offset, size)


@dataclass(frozen=True, slots=True)
class AppendedRun:
    """What the store answered for one appended record run."""

    count: int
    store_timestamp_ms: int
    physical_offsets: tuple[int, ...]
    queue_offsets: tuple[int, ...] = ()
    msg_id_prefix: str = ""


class StorageClient:
    def __init__(self, target: str) -> None:
        self.target = target
        # Carries the trace context of the calling span (while tracing is on).
        self._channel = traced_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.StorageStub(self._channel)
        # The last status the storage answered with (None before the first answer).
        self.last_status: pb.StorageStatus | None = None

    async def close(self) -> None:
        await self._channel.close(None)

    async def status(self, timeout_s: float = STATUS_TIMEOUT_S) -> pb.StorageStatus:
        status: pb.StorageStatus = await self._stub.GetStatus(
            pb.GetStatusRequest(), timeout=timeout_s
        )
        self.last_status = status
        return status

    async def wait_status(self, why: str, backoff: Backoff | None = None) -> pb.StorageStatus:
        """GetStatus, retried with backoff until the storage answers (forever). Logs a
        warning at the first failure and a reminder every WAIT_LOG_INTERVAL_S after."""
        backoff = backoff if backoff is not None else Backoff(initial_s=0.1, max_s=2.0)
        failures = 0
        started = last_log = time.monotonic()
        while True:
            try:
                status = await self.status()
            except grpc.aio.AioRpcError as exc:
                failures += 1
                now = time.monotonic()
                reason = f"{exc.code().name}: {exc.details()}"
                if failures == 1:
                    log.warning(
                        "storage %s does not answer GetStatus (%s); retrying until it does (%s)",
                        self.target,
                        reason,
                        why,
                    )
                    last_log = now
                elif now - last_log >= WAIT_LOG_INTERVAL_S:
                    log.warning(
                        "still waiting for storage %s after %.0f s, %d attempts: %s",
                        self.target,
                        now - started,
                        failures,
                        reason,
                    )
                    last_log = now
                await asyncio.sleep(backoff.delay_s(failures))
                continue
            if failures:
                log.info(
                    "storage %s answered after %d failed attempt(s), %.1f s",
                    self.target,
                    failures,
                    time.monotonic() - started,
                )
            return status

    async def read(self, positions: Sequence[Position]) -> list[pb.ReadResult]:
        """Read every (physical offset, size), in request order, in as many calls as the
        storage's limits need. Raises grpc.aio.AioRpcError."""
        results: list[pb.ReadResult] = []
        for part in _split(positions):
            request = pb.ReadRequest(
                positions=[pb.ReadRequest.Position(physical_offset=o, size=s) for o, s in part]
            )
            response: pb.ReadResponse = await self._stub.Read(request, timeout=RPC_TIMEOUT_S)
            if len(response.results) != len(part):
                raise RuntimeError(
                    f"storage {self.target} answered {len(response.results)} results "
                    f"for {len(part)} positions"
                )
            results.extend(response.results)
        return results

    async def read_records(self, positions: Sequence[Position]) -> list[bytes | None]:
        """The bytes of each record at (physical offset, size), None where the storage
        has no such record (deleted by retention, or not a record of that size), in as
        many Read calls (with spans) as the limits need. Raises grpc.aio.AioRpcError."""
        found: list[bytes | None] = []
        for part in _split(positions):
            spans = [pb.RecordSpan(physical_offset=o, size=s, count=1) for o, s in part]
            response: pb.ReadResponse = await self._stub.Read(
                pb.ReadRequest(spans=spans), timeout=RPC_TIMEOUT_S
            )
            if len(response.span_statuses) != len(part):
                raise RuntimeError(
                    f"storage {self.target} answered {len(response.span_statuses)} span "
                    f"statuses for {len(part)} spans"
                )
            data, pos = response.records, 0
            for (_, size), status in zip(part, response.span_statuses, strict=True):
                if status == pb.FOUND:
                    found.append(data[pos : pos + size])
                    pos += size
                else:
                    found.append(None)
        return found

    async def append_run(self, run: bytes, count: int) -> AppendedRun:
        """Append one record run (docs/formats.md, "Record runs") of ``count`` records as
        one batch. Raises grpc.aio.AioRpcError; the store writes all of it or none."""
        request = pb.AppendRequest(records=[run])
        response: pb.AppendResponse = await self._stub.Append(request, timeout=APPEND_TIMEOUT_S)
        return self.appended_run(response, count)

    async def connected(self, timeout_s: float) -> bool:
        """Whether the channel to the storage is (or gets) connected within
        ``timeout_s``: after the storage restarted, the channel may still be waiting out
        its reconnect backoff, and a call made then fails at once (UNAVAILABLE, "failed
        to connect") although the storage is back."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout_s)
        except TimeoutError:
            return False
        return True

    def open_append_stream(self) -> Any:
        """A new ``Storage.AppendStream`` call (its requests answered one by one, in
        order; errors in-band): for a caller that appends often, one at a time."""
        return self._stub.AppendStream(None)  # requests: write()

    def appended_run(self, response: pb.AppendResponse, count: int) -> AppendedRun:
        """What the store answered for a run of ``count`` records."""
        if len(response.physical_offsets) != count:
            raise RuntimeError(
                f"storage {self.target} answered {len(response.physical_offsets)} offsets "
                f"for {count} records"
            )
        return AppendedRun(
            count,
            response.store_timestamp_ms,
            tuple(response.physical_offsets),
            tuple(response.queue_offsets),
            response.msg_id_prefix,
        )

    # -- POP (issue 20): offsets, group configs, retry and dead-letter topics -------------
    async def get_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset of the queue, -1 for none. Raises AioRpcError."""
        request = pb.GetOffsetRequest(consumer_group=group, topic=topic, queue_id=queue_id)
        response: pb.GetOffsetResponse = await self._stub.GetOffset(request, timeout=RPC_TIMEOUT_S)
        return response.offset

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Raises AioRpcError."""
        request = pb.CommitOffsetRequest(
            consumer_group=group, topic=topic, queue_id=queue_id, offset=offset
        )
        await self._stub.CommitOffset(request, timeout=RPC_TIMEOUT_S)

    async def get_group(self, group: str) -> pb.GroupConfig:
        """The group's config (the defaults when it has none). Raises AioRpcError."""
        response: pb.GetGroupResponse = await self._stub.GetGroup(
            pb.GetGroupRequest(group=group), timeout=RPC_TIMEOUT_S
        )
        return response.group

    async def upsert_topic(self, topic: str, queue_nums: int, perm: int) -> None:
        """Raises AioRpcError."""
        config = pb.TopicConfig(
            topic_name=topic, read_queue_nums=queue_nums, write_queue_nums=queue_nums, perm=perm
        )
        await self._stub.UpsertTopic(pb.UpsertTopicRequest(topic=config), timeout=RPC_TIMEOUT_S)

    async def save_delivery_progress(
        self,
        delay_offsets_json: bytes = b"",
        timer_checkpoint: bytes = b"",
        transaction_checks_json: bytes = b"",
    ) -> None:
        """Copy the delivery and transaction services' progress to the storage (slaves get
        it from there). Raises grpc.aio.AioRpcError."""
        request = pb.SaveDeliveryProgressRequest(
            delay_offsets_json=delay_offsets_json,
            timer_checkpoint=timer_checkpoint,
            transaction_checks_json=transaction_checks_json,
        )
        await self._stub.SaveDeliveryProgress(request, timeout=PROGRESS_TIMEOUT_S)


def _split(positions: Sequence[Position]) -> list[Sequence[Position]]:
    """Runs of positions within one Read's limits (READ_MAX_POSITIONS, READ_MAX_BYTES)."""
    parts: list[Sequence[Position]] = []
    start = 0
    total = 0
    for index, (_, size) in enumerate(positions):
        if index > start and (index - start >= READ_MAX_POSITIONS or total + size > READ_MAX_BYTES):
            parts.append(positions[start:index])
            start, total = index, 0
        total += size
    if start < len(positions):
        parts.append(positions[start:])
    return parts

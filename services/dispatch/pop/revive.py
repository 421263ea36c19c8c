"""The revive service: messages whose invisible time passed are delivered again
(issue 20, docs/pop.md; RocketMQ's PopReviveService).

Every ``revive_interval_ms`` (master only), each checkpoint held past its invisible time,
oldest first (at most REVIVE_BATCH a round):

* not FIFO: the message is read back and stored again in the group's POP retry topic
  ``%RETRY%<group>_<topic>`` queue 0 (created on first use: 1 queue, read + write) with
  reconsume times + 1 and its identity kept (topic in RETRY_TOPIC, msg id in
  ORIGIN_MESSAGE_ID, UNIQ_KEY, keys, tags, properties), or, once it was reconsumed the
  group's ``retry_max_times``, in ``%DLQ%<group>`` queue 0 (as send-back does); the copy
  and the ack resolving the checkpoint are ONE Append, so after any crash either both
  are stored or neither (the checkpoint is then revived again: no second copy).
* FIFO: the queue goes back to its oldest message held (delivered again in place, the
  same queue offset, attempt + 1; nothing written); one that had its last attempt goes
  to %DLQ%<group> with its ack (one Append) and is skipped.
"""

from __future__ import annotations

import logging
import time

import grpc

from services.dispatch.pop.handles import held_checkpoint
from services.dispatch.pop.records import ack_record, dead_letter_copy, retry_copy
from services.dispatch.pop.service import PopService
from services.dispatch.pop.state import key_of
from tide.format import (
    ACK_REASON_DLQ,
    ACK_REASON_REVIVE,
    DEFAULT_RETRY_MAX_TIMES,
    DLQ_QUEUE_NUMS,
    POP_RETRY_QUEUE_NUMS,
    PopAck,
    PopCheckpoint,
    dlq_topic,
    make_msg_id,
    pop_retry_topic,
    should_dead_letter,
)
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

log = logging.getLogger("tide.dispatch.pop.revive")

REVIVE_BATCH = 256  # checkpoints revived per round at most (the rest: next round)
GROUP_CACHE_S = 10.0  # a group's retry maximum is read again after this
MAX_CACHED_GROUPS = 10_000
PERM_READ_WRITE = 6
PERM_WRITE_ONLY = 2  # a dead-letter topic (as send-back creates it)


class Reviver:
    def __init__(self, service: PopService) -> None:
        self._service = service
        self._topics: set[str] = set()  # created on this storage by this process
        self._groups: dict[str, tuple[float, int]] = {}
        self.revived = 0
        self.dead_lettered = 0

    async def round(self) -> None:
        service = self._service
        async with service.lock:
            await service.ready()
            now = service.clock_ms()
            held = service.state.held
            due = sorted(offset for offset, ck in held.items() if ck.invisible_until_ms <= now)
            for offset in due[:REVIVE_BATCH]:
                ck = held.get(offset)
                if ck is None:  # a FIFO queue moved back with an earlier one
                    continue
                if ck.fifo:
                    await self._fifo_expired(offset, ck)
                else:
                    await self._revive(offset, ck)

    async def _revive(self, offset: int, ck: PopCheckpoint) -> None:
        stored = await self._read(ck)
        service = self._service
        now = service.clock_ms()
        if stored is None:  # removed by retention: nothing to deliver again
            await service.append(ack_record(PopAck(offset, ACK_REASON_REVIVE), now), 1)
            service.state.resolve(offset)
            return
        max_times = await self._retry_max(ck.group)
        if should_dead_letter(stored.reconsume_times, max_times):
            await self._dead_letter(offset, ck, stored, max_times)
            return
        topic = pop_retry_topic(ck.group, ck.origin_topic)
        await self.ensure_topic(topic, POP_RETRY_QUEUE_NUMS, PERM_READ_WRITE)
        run = retry_copy(stored, topic, max_times, offset) + ack_record(
            PopAck(offset, ACK_REASON_REVIVE), now
        )
        await service.append(run, 2)
        service.state.resolve(offset)
        self.revived += 1

    async def _dead_letter(
        self, offset: int, ck: PopCheckpoint, stored: storage_pb.StoredMessage, max_times: int
    ) -> tuple[str, str]:
        """Store the message in %DLQ%<group> and resolve its checkpoint; the dead
        letter's topic and offset msg id."""
        service = self._service
        topic = dlq_topic(ck.group)
        await self.ensure_topic(topic, DLQ_QUEUE_NUMS, PERM_WRITE_ONLY)
        run = dead_letter_copy(stored, topic, max_times) + ack_record(
            PopAck(offset, ACK_REASON_DLQ), service.clock_ms()
        )
        appended = await service.append(run, 2)
        service.state.resolve(offset)
        if ck.fifo:
            service.state.fifo_acked.setdefault(key_of(ck), set()).add(ck.queue_offset)
        self.dead_lettered += 1
        log.info(
            "message %s of group %s dead-lettered after %d attempts",
            stored.msg_id,
            quote(ck.group),
            ck.attempt,
        )
        return topic, make_msg_id(appended.msg_id_prefix, appended.physical_offsets[0])

    async def dead_letter_now(self, request: pb.PopDeadLetterRequest) -> tuple[str, str]:
        """ForwardToDeadLetter: the client gave up on the message."""
        service = self._service
        async with service.lock:
            await service.ready()
            group, topic = request.consumer_group, request.topic
            ck = held_checkpoint(service, group, topic, request.entry)
            return await self._forward(request.entry.checkpoint_offset, ck)

    async def _forward(self, offset: int, ck: PopCheckpoint) -> tuple[str, str]:
        stored = await self._read(ck)
        if stored is None:
            raise ServiceError(
                grpc.StatusCode.NOT_FOUND,
                f"the message at commitlog offset {ck.physical_offset} is no longer stored",
            )
        return await self._dead_letter(offset, ck, stored, await self._retry_max(ck.group))

    async def _fifo_expired(self, offset: int, ck: PopCheckpoint) -> None:
        max_times = await self._retry_max(ck.group)
        # Delivered ck.attempt times: reconsumed ck.attempt - 1 times (as the retry copy counts).
        if should_dead_letter(ck.attempt - 1, max_times):
            stored = await self._read(ck)
            if stored is not None:
                await self._dead_letter(offset, ck, stored, max_times)
        self._service.state.fifo_expired(key_of(ck))

    async def _read(self, ck: PopCheckpoint) -> storage_pb.StoredMessage | None:
        service = self._service
        (result,) = await service.call(service.storage.read([(ck.physical_offset, ck.size)]))
        return result.message if result.status == storage_pb.FOUND else None

    async def _retry_max(self, group: str) -> int:
        cached = self._groups.get(group)
        now_s = time.monotonic()
        if cached is not None and now_s - cached[0] < GROUP_CACHE_S:
            return cached[1]
        try:
            config = await self._service.storage.get_group(group)
            retry_max = config.retry_max_times
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise ServiceError(exc.code(), f"storage: {exc.details()}") from exc
            retry_max = DEFAULT_RETRY_MAX_TIMES
        if len(self._groups) >= MAX_CACHED_GROUPS:
            self._groups.clear()
        self._groups[group] = (now_s, retry_max)
        return retry_max

    async def ensure_topic(self, topic: str, queue_nums: int, perm: int) -> None:
        if topic in self._topics:
            return
        await self._service.call(self._service.storage.upsert_topic(topic, queue_nums, perm))
        self._topics.add(topic)

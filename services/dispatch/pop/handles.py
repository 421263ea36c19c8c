"""The POP calls on checkpoints: Ack (coalesced), ChangeInvisibleDuration, and lag
(issue 20, docs/pop.md; RocketMQ's AckMessageProcessor, ChangeInvisibleTimeProcessor).

Acks of many calls share an Append: a PopAck queues its request and waits; whichever
call holds the POP lock next checks every request queued (at most ACK_RUN_MAX_RECORDS
ack records together, the rest go in the next run) and writes their ack records as one
run. A failed Append fails every call of that run (none of their acks is resolved)."""

from __future__ import annotations

import asyncio
from collections import deque

import grpc

from services.dispatch.pop.records import ack_record, checkpoint_record
from services.dispatch.pop.service import PopService, retry_topic_of
from services.dispatch.pop.state import key_of
from tide.format import ACK_REASON_ACK, ACK_REASON_CHANGE, PopAck, PopCheckpoint
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as pb

ACK_RUN_MAX_RECORDS = 4_096  # ack records one Append carries at most (~150 bytes each)
_Waiting = tuple[pb.PopAckRequest, "asyncio.Future[pb.PopAckResponse]"]


def held_checkpoint(
    service: PopService, group: str, topic: str, entry: pb.PopAckEntry
) -> PopCheckpoint:
    """The checkpoint an entry names, checked: NOT_FOUND (not held), INVALID_ARGUMENT
    (another group's, topic's or position), FAILED_PRECONDITION (its invisible time
    passed)."""
    ck = service.state.held.get(entry.checkpoint_offset)
    if ck is None:
        raise ServiceError(
            grpc.StatusCode.NOT_FOUND,
            f"no message received with checkpoint {entry.checkpoint_offset} is waiting for "
            "an ack (acked already, delivered again, or never received)",
        )
    if (ck.group, ck.origin_topic, ck.queue_offset) != (group, topic, entry.queue_offset):
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the receipt handle is not one of group {quote(group)} on topic {quote(topic)}",
        )
    if ck.invisible_until_ms <= service.clock_ms():
        raise ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the message's invisible time passed at {ck.invisible_until_ms} ms: it is "
            "delivered again; ack the new delivery",
        )
    return ck


class PopHandles:
    def __init__(self, service: PopService) -> None:
        self._service = service
        self._waiting: deque[_Waiting] = deque()
        self.runs = 0  # ack Appends written (calls / runs: how much coalescing helps)

    # -- Ack -------------------------------------------------------------------------
    async def ack(self, request: pb.PopAckRequest) -> pb.PopAckResponse:
        future: asyncio.Future[pb.PopAckResponse] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        while not future.done():
            async with self._service.lock:
                if not future.done():
                    await self._ack_run()
        return future.result()

    async def _ack_run(self) -> None:
        """Check and write the acks of the calls waiting (lock held)."""
        service = self._service
        taken: list[tuple[_Waiting, list[pb.PopAckResult]]] = []
        offsets: list[int] = []
        try:
            await service.ready()
        except ServiceError as exc:
            while self._waiting:
                _fail(self._waiting.popleft()[1], exc)
            return
        while self._waiting:
            request, future = self._waiting[0]
            if taken and len(offsets) + len(request.entries) > ACK_RUN_MAX_RECORDS:
                break
            self._waiting.popleft()
            if future.done():  # its call was cancelled
                continue
            results = self._check(request, offsets)
            taken.append(((request, future), results))
        if offsets:
            now = service.clock_ms()
            run = b"".join(ack_record(PopAck(o, ACK_REASON_ACK), now) for o in offsets)
            try:
                await service.append(run, len(offsets))
            except ServiceError as exc:
                for (_, future), _ in taken:
                    _fail(future, exc)
                return
            except BaseException:
                # Anything else (this call cancelled mid-Append, a bad answer): the other
                # calls of the run must not wait forever; whether it was written is unknown.
                unknown = ServiceError(
                    grpc.StatusCode.UNAVAILABLE,
                    "the ack's Append did not complete; ack again (an ack of a handle "
                    "acked already is refused as not held)",
                )
                for (_, future), _ in taken:
                    _fail(future, unknown)
                raise
            self.runs += 1
            for offset in offsets:
                self._acked(offset)
        for (_, future), results in taken:
            if not future.done():
                future.set_result(pb.PopAckResponse(results=results))

    def _check(self, request: pb.PopAckRequest, offsets: list[int]) -> list[pb.PopAckResult]:
        results: list[pb.PopAckResult] = []
        for entry in request.entries:
            try:
                held_checkpoint(self._service, request.consumer_group, request.topic, entry)
            except ServiceError as exc:
                results.append(pb.PopAckResult(code=exc.code.value[0], message=exc.message))
                continue
            if entry.checkpoint_offset not in offsets:
                offsets.append(entry.checkpoint_offset)
            results.append(pb.PopAckResult())
        return results

    def _acked(self, offset: int) -> None:
        state = self._service.state
        ck = state.resolve(offset)
        if ck is not None and ck.fifo:
            state.fifo_acked.setdefault(key_of(ck), set()).add(ck.queue_offset)

    # -- ChangeInvisibleDuration ---------------------------------------------------------
    async def change_invisible(
        self, request: pb.PopChangeInvisibleRequest
    ) -> pb.PopChangeInvisibleResponse:
        service = self._service
        async with service.lock:
            await service.ready()
            old = held_checkpoint(service, request.consumer_group, request.topic, request.entry)
            now = service.clock_ms()
            until = now + request.invisible_duration_ms
            new = PopCheckpoint(
                old.group,
                old.topic,
                old.queue_id,
                old.queue_offset,
                old.physical_offset,
                old.size,
                old.attempt,
                until,
                old.fifo,
                old.origin_topic,
            )
            offset = request.entry.checkpoint_offset
            run = checkpoint_record(new, now) + ack_record(PopAck(offset, ACK_REASON_CHANGE), now)
            appended = await service.append(run, 2)
            service.state.resolve(offset)
            service.state.add(appended.queue_offsets[0], new)
            return pb.PopChangeInvisibleResponse(
                checkpoint_offset=appended.queue_offsets[0], invisible_until_ms=until
            )

    # -- lag -------------------------------------------------------------------------------
    async def lag(self, request: pb.GetPopLagRequest) -> pb.GetPopLagResponse:
        service = self._service
        async with service.lock:
            await service.ready()
            response = pb.GetPopLagResponse()
            group, topic = request.consumer_group, request.topic
            for queue_id in request.queue_ids:
                key = (group, topic, queue_id)
                queue = service.queues.find(topic, queue_id)
                offset = service.state.next.get(key)
                if offset is None:
                    offset = await service.stored_offset(key)
                response.queues.append(
                    pb.PopQueueLag(
                        queue_id=queue_id,
                        max_offset=queue.max_offset if queue is not None else 0,
                        consumer_offset=offset,
                        inflight=service.state.inflight(key),
                    )
                )
            response.delayed = await self._delayed(group, topic)
            return response

    async def _delayed(self, group: str, topic: str) -> int:
        """Messages in the group's POP retry topic not received again yet, and those past
        their invisible time not revived yet."""
        service = self._service
        retry_key = (group, retry_topic_of(group, topic), 0)
        retry = service.queues.find(retry_key[1], 0)
        waiting = 0
        if retry is not None:
            offset = service.state.next.get(retry_key)
            if offset is None:
                offset = await service.stored_offset(retry_key)
            waiting = max(0, retry.max_offset - max(offset, retry.min_offset))
        now = service.clock_ms()
        due = sum(
            1
            for ck in service.state.held.values()
            if ck.group == group and ck.origin_topic == topic and ck.invisible_until_ms <= now
        )
        return waiting + due


def _fail(future: asyncio.Future[pb.PopAckResponse], error: ServiceError) -> None:
    if not future.done():
        future.set_exception(error)

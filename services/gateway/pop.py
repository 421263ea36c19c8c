"""POP consumption on the gateway (issue 20, docs/pop.md): ``PopConsumers``, the entry
point both wire APIs call (tide.v1's Receive / Ack / ChangeInvisibleDuration /
ForwardToDeadLetter / GetGroupLag, and the v2 API's).

The brokers' dispatches hold the state (services/dispatch/pop/): a Receive asks the
masters of the brokers serving the topic concurrently, each for a share of
``max_messages`` (receive_shares; a broker turn moves each call), and asks again those
that filled their share while messages are still wanted; the dispatch writes the
checkpoints and answers the stored messages. This module checks the request at the edge,
builds the receipt handles (tide.format's ReceiptHandle: the broker name, the
checkpoint, the queue position) and holds a Receive with nothing to receive on the
arrivals of the topic's queues and of the group's POP retry topic (long_poll.py's
HeldPulls: a future per queue watched, no thread), until an arrival, the request's
long_poll_timeout_ms or the call's deadline, whichever is first. Handle calls are in
pop_handles.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import grpc

from services.gateway.arrived import QueueKey
from services.gateway.brokers import BrokerChannels, broker_error
from services.gateway.expression import ExpressionError, parse_expression
from services.gateway.long_poll import HeldPulls
from services.gateway.options import GatewayConfig
from services.gateway.pop_groups import PopGroups
from services.gateway.pop_handles import PopHandles
from services.gateway.routes import PERM_READ, Member, RouteCache, TopicView
from services.gateway.validate import check_group, check_topic, invalid
from tide.format import (
    ORIGIN_MESSAGE_ID,
    POP_ORIGIN_QUEUE_ID,
    POP_ORIGIN_QUEUE_OFFSET,
    RETRY_TOPIC,
    ReceiptHandle,
    TopicMessageType,
    encode_handle,
    is_hidden_topic,
    pop_retry_topic,
)
from tide.limits import POP_INVISIBLE_MAX_MS, POP_INVISIBLE_MIN_MS, PULL_MAX_MESSAGES
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import gateway_pb2 as pb

# A held Receive answers this long before the call's deadline (the answer must arrive).
DEADLINE_MARGIN_MS = 200
ANY_QUEUE = -1
# Brokers one Receive asks at once (a round); the others are asked in the next rounds.
POP_BROKERS_AT_ONCE = 16


class PopConsumers:
    def __init__(
        self, config: GatewayConfig, routes: RouteCache, channels: BrokerChannels, held: HeldPulls
    ) -> None:
        self._config = config
        self._routes = routes
        self._channels = channels
        self._held = held
        self._groups = PopGroups(channels, config.broker_timeout_s)
        self._handles = PopHandles(config, routes, channels)
        self._turn = 0
        self._holding = 0  # Receives held now (--max-held-receives)

    # -- Receive -----------------------------------------------------------------------
    async def receive(
        self, request: pb.ReceiveRequest, *, deadline_ms: int | None
    ) -> pb.ReceiveResponse:
        """``deadline_ms``: the call's deadline (ms since epoch), None for none."""
        tags = self._check_receive(request)
        view = await self._routes.get(request.topic)
        masters = self._masters(view, request)
        orderly = await self._groups.orderly(request.consumer_group, masters)
        fifo = view.message_type is TopicMessageType.FIFO and orderly
        wait_until_ms = _wait_end(request.long_poll_timeout_ms, deadline_ms)
        while True:
            since = self._held.sequence
            messages, ends, now_ms = await self._pop_all(request, view, masters, tags, fifo)
            remaining_ms = wait_until_ms - _now_ms()
            if messages or remaining_ms <= 0 or not ends:
                return pb.ReceiveResponse(messages=messages, delivery_timestamp_ms=now_ms)
            if not await self._hold(ends, since, remaining_ms / 1000):
                return pb.ReceiveResponse(delivery_timestamp_ms=_now_ms())

    def _check_receive(self, request: pb.ReceiveRequest) -> list[str]:
        check_group(request.consumer_group)
        check_topic(request.topic)
        if is_hidden_topic(request.topic):
            raise invalid(
                f"topic {quote(request.topic)} is a system, retry or dead-letter topic; receive "
                "from the topic the messages were produced to (its retries come with it)"
            )
        if not 1 <= request.max_messages <= PULL_MAX_MESSAGES:
            raise invalid(
                f"max_messages must be in 1..{PULL_MAX_MESSAGES} (got {request.max_messages})"
            )
        duration = request.invisible_duration_ms
        if not POP_INVISIBLE_MIN_MS <= duration <= POP_INVISIBLE_MAX_MS:
            raise invalid(
                f"invisible_duration_ms must be in {POP_INVISIBLE_MIN_MS}..{POP_INVISIBLE_MAX_MS} "
                f"(POP_INVISIBLE_MIN_MS..POP_INVISIBLE_MAX_MS: 10 s .. 12 h; got {duration})"
            )
        timeout_ms = request.long_poll_timeout_ms
        if not 0 <= timeout_ms <= self._config.max_long_poll_ms:
            raise invalid(
                f"long_poll_timeout_ms must be in 0..{self._config.max_long_poll_ms} "
                f"(--max-long-poll-ms; got {timeout_ms})"
            )
        try:
            tag_filter = parse_expression(request.expression)
            pop_retry_topic(request.consumer_group, request.topic)  # the two names fit one
        except ExpressionError as exc:
            raise invalid(f"expression: {exc}") from exc
        except ValueError as exc:
            raise invalid(str(exc)) from exc
        return sorted(tag_filter.tags)

    def _masters(
        self, view: TopicView, request: pb.ReceiveRequest
    ) -> list[tuple[Member, list[int]]]:
        """The masters to ask and their readable queue ids, from a broker that turns."""
        wanted = request.queue.broker_name if request.HasField("queue") else ""
        found: list[tuple[Member, list[int]]] = []
        for name in sorted(view.queue_data):
            data = view.queue_data[name]
            if wanted and name != wanted:
                continue
            master = view.master(name)
            if master is None or not data.perm & PERM_READ or data.read_queue_nums <= 0:
                continue
            queue_ids = list(range(data.read_queue_nums))
            if wanted and request.queue.queue_id != ANY_QUEUE:
                if not 0 <= request.queue.queue_id < data.read_queue_nums:
                    raise ServiceError(
                        grpc.StatusCode.NOT_FOUND,
                        f"queue_id {request.queue.queue_id} is out of range: topic "
                        f"{quote(view.topic)} has {data.read_queue_nums} read queues on "
                        f"broker {quote(name)}",
                    )
                queue_ids = [request.queue.queue_id]
            found.append((master, queue_ids))
        if not found:
            where = f"broker {quote(wanted)}" if wanted else "any broker"
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE
                if not wanted or wanted in view.queue_data
                else grpc.StatusCode.NOT_FOUND,
                f"topic {quote(view.topic)} has no readable queue with a live master on {where}",
            )
        self._turn += 1
        turn = self._turn % len(found)
        return found[turn:] + found[:turn]

    async def _pop_all(
        self,
        request: pb.ReceiveRequest,
        view: TopicView,
        masters: Sequence[tuple[Member, list[int]]],
        tags: list[str],
        fifo: bool,
    ) -> tuple[list[pb.ReceivedMessage], list[tuple[QueueKey, int]], int]:
        """The messages of every master, asked concurrently (until max_messages), the
        queues' max offsets seen (to hold on), and the time of the first answer.

        The share rule (docs/pop.md): each round splits what is still wanted among the
        brokers still worth asking (receive_shares), so the answers of one round never
        add up to more than max_messages and no message a broker handed out is dropped.
        A broker that answered less than its share has no more now and is not asked
        again (nor one that failed); one that filled it, or got no share yet, is asked
        in the next round. A round ends with nothing more wanted or at least one broker
        dropped, so there are at most len(masters) + 1 rounds."""
        messages: list[pb.ReceivedMessage] = []
        ends: list[tuple[QueueKey, int]] = []
        first_ms = 0
        failure: ServiceError | None = None
        asking = list(masters)
        while asking and len(messages) < request.max_messages:
            shares = receive_shares(request.max_messages - len(messages), len(asking))
            asked = [(m, share) for m, share in zip(asking, shares, strict=True) if share]
            answers = await asyncio.gather(
                *(self._pop_one(request, master, share, tags, fifo) for master, share in asked)
            )
            still = [m for m, share in zip(asking, shares, strict=True) if not share]
            for (master, share), answer in zip(asked, answers, strict=True):
                if isinstance(answer, ServiceError):
                    failure = answer
                    continue
                first_ms = first_ms or answer.pop_timestamp_ms
                messages.extend(_received(m, master[0].broker_name) for m in answer.messages)
                ends.extend(self._ends(request, master, answer, fifo))
                if len(answer.messages) >= share:
                    still.append(master)
            asking = still
        if not messages and failure is not None and not ends:
            raise failure
        return messages, ends, first_ms or _now_ms()

    async def _pop_one(
        self,
        request: pb.ReceiveRequest,
        master: tuple[Member, list[int]],
        share: int,
        tags: list[str],
        fifo: bool,
    ) -> dispatch_pb.PopMessagesResponse | ServiceError:
        """One broker's PopMessages for ``share`` messages, or the error it gave."""
        member, queue_ids = master
        pop = dispatch_pb.PopMessagesRequest(
            consumer_group=request.consumer_group,
            topic=request.topic,
            queue_ids=queue_ids,
            max_messages=share,
            invisible_duration_ms=request.invisible_duration_ms,
            tags=tags,
            fifo=fifo,
            with_retry=not fifo,
        )
        try:
            async with self._channels.limit(member.dispatch):
                answer: dispatch_pb.PopMessagesResponse = await self._channels.dispatch(
                    member.dispatch
                ).PopMessages(pop, timeout=self._config.broker_timeout_s)
        except grpc.aio.AioRpcError as exc:
            return broker_error(exc, f"PopMessages on broker {quote(member.broker_name)}")
        return answer

    @staticmethod
    def _ends(
        request: pb.ReceiveRequest,
        master: tuple[Member, list[int]],
        answer: dispatch_pb.PopMessagesResponse,
        fifo: bool,
    ) -> list[tuple[QueueKey, int]]:
        member, queue_ids = master
        ends: list[tuple[QueueKey, int]] = [
            ((member.dispatch, request.topic, queue_id), end)
            for queue_id, end in zip(queue_ids, answer.max_offsets, strict=False)
        ]
        if not fifo:
            retry_topic = pop_retry_topic(request.consumer_group, request.topic)
            ends.append(((member.dispatch, retry_topic, 0), answer.retry_max_offset))
        return ends

    async def _hold(self, ends: list[tuple[QueueKey, int]], since: int, timeout_s: float) -> bool:
        """Wait for an arrival past any of the ends (True) or the timeout (False)."""
        if self._holding >= self._config.max_held_receives:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self._holding} Receives are held already, the limit (--max-held-receives "
                f"{self._config.max_held_receives}); retry later or with a shorter "
                "long_poll_timeout_ms",
            )
        self._holding += 1
        waits = [
            asyncio.ensure_future(self._held.wait(key, end, timeout_s, since)) for key, end in ends
        ]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return any(task.result() for task in done)
        finally:
            self._holding -= 1
            for task in waits:
                task.cancel()
            for task in waits:
                with contextlib.suppress(asyncio.CancelledError, ServiceError):
                    await task

    @property
    def holding(self) -> int:
        return self._holding

    # -- handle calls (pop_handles.py) ------------------------------------------------
    async def ack(self, request: pb.AckRequest) -> pb.AckResponse:
        return await self._handles.ack(request)

    async def change_invisible_duration(
        self, request: pb.ChangeInvisibleDurationRequest
    ) -> pb.ChangeInvisibleDurationResponse:
        return await self._handles.change_invisible_duration(request)

    async def forward_to_dead_letter(
        self, request: pb.ForwardToDeadLetterRequest
    ) -> pb.ForwardToDeadLetterResponse:
        return await self._handles.forward_to_dead_letter(request)

    async def group_lag(self, request: pb.GetGroupLagRequest) -> pb.GetGroupLagResponse:
        return await self._handles.group_lag(request)


def _received(popped: dispatch_pb.PoppedMessage, broker_name: str) -> pb.ReceivedMessage:
    """The message as the consumer sees it: a redelivery through the POP retry topic
    shows its original's topic, queue, offset and msg id."""
    stored = popped.message
    handle = ReceiptHandle(
        checkpoint_offset=popped.checkpoint_offset,
        queue_id=stored.queue_id,
        queue_offset=stored.queue_offset,
        invisible_until_ms=popped.invisible_until_ms,
        retry=popped.retry,
        broker_name=broker_name,
    )
    if popped.retry:
        props = stored.properties
        stored.topic = props.get(RETRY_TOPIC, stored.topic)
        stored.msg_id = props.get(ORIGIN_MESSAGE_ID, stored.msg_id)
        with contextlib.suppress(ValueError):
            stored.queue_id = int(props.get(POP_ORIGIN_QUEUE_ID, stored.queue_id))
            stored.queue_offset = int(props.get(POP_ORIGIN_QUEUE_OFFSET, stored.queue_offset))
    return pb.ReceivedMessage(
        message=stored,
        broker_name=broker_name,
        receipt_handle=encode_handle(handle),
        delivery_attempt=popped.delivery_attempt,
        invisible_until_ms=popped.invisible_until_ms,
    )


def receive_shares(wanted: int, brokers: int) -> list[int]:
    """``wanted`` split among the first (at most POP_BROKERS_AT_ONCE) of ``brokers`` in
    turn order: as even as can be, the first ones one more; with fewer wanted than
    brokers the last ones get 0 (asked in a next round if the first ones run short).
    The shares add up to ``wanted``."""
    asked = min(brokers, POP_BROKERS_AT_ONCE)
    base, extra = divmod(wanted, asked)
    shares = [base + (1 if i < extra else 0) for i in range(asked)]
    return shares + [0] * (brokers - asked)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _wait_end(long_poll_timeout_ms: int, deadline_ms: int | None) -> int:
    end = _now_ms() + long_poll_timeout_ms
    if deadline_ms is not None:
        end = min(end, deadline_ms - DEADLINE_MARGIN_MS)
    return end

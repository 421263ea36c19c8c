"""Telemetry: the v2 clients' bidirectional settings stream.

* Each ``settings`` command is answered on the same stream with status OK and the
  settings the client should use (its own, completed: a producer's body limit and type
  check; a consumer's batch size, long polling timeout, FIFO flag and retry policy from
  its group). Without that answer the clients hang or fail their start.
* A producer whose settings list topics gets, for each, the due transaction checks of
  that topic's producer group (v2 producers are grouped by topic) as
  RecoverOrphanedTransactionCommand, for as long as its stream is open.
* Commands only a server sends (thread stacks, message verification, reconnects,
  check-backs) are refused with UNSUPPORTED naming them; the answers to such commands
  are taken without a reply (the gateway sends none of those commands).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from services.gateway.groups import GroupAdmin
from services.gateway.transactions import Transactions
from services.gateway.v2.messages import to_duration
from services.gateway.v2.status import OK, V2Error, group_of, status, status_of
from services.gateway.v2.transactions import recover_command
from tide.format import DEFAULT_DELAY_LEVEL_TABLE
from tide.naming import consumer_group_error
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

log = logging.getLogger("tide.gateway.v2.telemetry")

OUTBOX_COMMANDS = 64
"""Commands waiting to be written to one client; the check loops wait past it."""
MAX_CHECKED_TOPICS = 64
"""Topics of one producer's settings whose transaction checks its stream takes."""
CHECK_RETRY_S = 1.0
"""Wait before a check loop that failed (no name server, no broker) tries again."""
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_TIMEOUT_MS = 20_000
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF = v2.ExponentialBackoff(
    initial=to_duration(10), max=to_duration(1_000), multiplier=2.0
)
# RocketMQ's CustomizedRetryPolicy starts at delay level 3 (tide.format retry policies).
_CUSTOMIZED_SHIFT = 2
_SERVER_ONLY = (
    "print_thread_stack_trace_command",
    "verify_message_command",
    "reconnect_endpoints_command",
    "recover_orphaned_transaction_command",
    "notify_unsubscribe_lite_command",
)
_ANSWERS = ("thread_stack_trace", "verify_message_result")


class Telemetry:
    def __init__(
        self,
        groups: GroupAdmin,
        transactions: Transactions,
        max_body_bytes: int,
        type_check: bool,
    ) -> None:
        self._groups = groups
        self._transactions = transactions
        self._max_body_bytes = max_body_bytes
        self._type_check = type_check
        # The open streams' outboxes: shutdown ends them (drain) instead of letting them
        # hold the grace period.
        self._outboxes: set[asyncio.Queue[v2s.TelemetryCommand | None]] = set()

    def drain(self) -> None:
        """Shutdown: end every open stream after what it has already answered."""
        for outbox in self._outboxes:
            while not outbox.empty():
                outbox.get_nowait()  # commands not yet written: a client asks again
            outbox.put_nowait(None)

    async def serve(
        self, requests: AsyncIterator[v2s.TelemetryCommand]
    ) -> AsyncIterator[v2s.TelemetryCommand]:
        """The answers and commands for one client's stream, until it closes it."""
        outbox: asyncio.Queue[v2s.TelemetryCommand | None] = asyncio.Queue(OUTBOX_COMMANDS)
        checks: dict[str, asyncio.Task[None]] = {}
        reader = asyncio.create_task(self._read(requests, outbox, checks))
        self._outboxes.add(outbox)
        try:
            while (command := await outbox.get()) is not None:
                yield command
        finally:
            self._outboxes.discard(outbox)
            reader.cancel()
            for task in checks.values():
                task.cancel()

    async def _read(
        self,
        requests: AsyncIterator[v2s.TelemetryCommand],
        outbox: asyncio.Queue[v2s.TelemetryCommand | None],
        checks: dict[str, asyncio.Task[None]],
    ) -> None:
        try:
            async for command in requests:
                answer = await self._answer(command, outbox, checks)
                if answer is not None:
                    await outbox.put(answer)
        finally:
            await outbox.put(None)

    async def _answer(
        self,
        command: v2s.TelemetryCommand,
        outbox: asyncio.Queue[v2s.TelemetryCommand | None],
        checks: dict[str, asyncio.Task[None]],
    ) -> v2s.TelemetryCommand | None:
        kind = command.WhichOneof("command")
        if kind == "settings":
            try:
                settings = await self._settings(command.settings)
            except Exception as exc:
                return v2s.TelemetryCommand(status=status_of(exc))
            if settings.HasField("publishing"):
                self._take_checks(settings.publishing, outbox, checks)
            return v2s.TelemetryCommand(status=OK, settings=settings)
        if kind in _SERVER_ONLY:
            return v2s.TelemetryCommand(
                status=status(
                    v2.UNSUPPORTED,
                    f"{kind} is a command the server sends a client; the gateway does not "
                    "take it from clients",
                )
            )
        if kind not in _ANSWERS:  # a status alone or a future command: nothing to say
            log.debug("telemetry command %s taken without an answer", kind)
        return None

    async def _settings(self, client: v2.Settings) -> v2.Settings:
        settings = v2.Settings()
        settings.CopyFrom(client)
        if client.HasField("subscription"):
            await self._subscription(settings)
            return settings
        publishing = settings.publishing
        publishing.max_body_size = self._max_body_bytes  # 0 would refuse every send
        publishing.validate_message_type = self._type_check
        if not client.HasField("backoff_policy"):
            settings.backoff_policy.CopyFrom(
                v2.RetryPolicy(
                    max_attempts=PRODUCER_MAX_ATTEMPTS, exponential_backoff=PRODUCER_BACKOFF
                )
            )
        return settings

    async def _subscription(self, settings: v2.Settings) -> None:
        subscription = settings.subscription
        group = group_of(subscription.group, "settings.subscription.group")
        found = await self._groups.get(storage_pb.GetGroupRequest(group=group))
        config = found.group
        subscription.fifo = config.consume_message_orderly
        subscription.receive_batch_size = RECEIVE_BATCH_SIZE
        subscription.long_polling_timeout.CopyFrom(to_duration(LONG_POLLING_TIMEOUT_MS))
        settings.backoff_policy.CopyFrom(_retry_policy(config))

    def _take_checks(
        self,
        publishing: v2.Publishing,
        outbox: asyncio.Queue[v2s.TelemetryCommand | None],
        checks: dict[str, asyncio.Task[None]],
    ) -> None:
        for resource in publishing.topics:
            topic = resource.name
            if topic in checks or consumer_group_error(topic) is not None:
                continue  # taken already, or not a name a producer group can have
            if len(checks) >= MAX_CHECKED_TOPICS:
                log.warning(
                    "a producer lists more than %d topics: checks of %s not taken",
                    MAX_CHECKED_TOPICS,
                    topic,
                )
                return
            checks[topic] = asyncio.create_task(self._check_loop(topic, outbox))

    async def _check_loop(
        self, topic: str, outbox: asyncio.Queue[v2s.TelemetryCommand | None]
    ) -> None:
        request = pb.TransactionChecksRequest(producer_group=topic)
        while True:
            try:
                async for check in self._transactions.checks(request):
                    await outbox.put(recover_command(check.half))
            except (ServiceError, V2Error) as exc:
                log.debug("transaction checks of %s: %s; trying again", topic, exc)
            await asyncio.sleep(CHECK_RETRY_S)


def _retry_policy(config: storage_pb.GroupConfig) -> v2.RetryPolicy:
    """The group's retry policy as the clients take it (attempts count the first)."""
    policy = v2.RetryPolicy(max_attempts=config.retry_max_times + 1)
    stored = config.retry_policy
    if stored.type == storage_pb.RetryPolicy.EXPONENTIAL:
        policy.exponential_backoff.CopyFrom(
            v2.ExponentialBackoff(
                initial=to_duration(stored.initial_ms or 5_000),
                max=to_duration(stored.max_ms or 7_200_000),
                multiplier=float(stored.multiplier or 2),
            )
        )
        return policy
    delays_ms = list(stored.delays_ms) or list(DEFAULT_DELAY_LEVEL_TABLE.delays_ms)
    shifted = delays_ms[_CUSTOMIZED_SHIFT:] or delays_ms[-1:]
    policy.customized_backoff.next.extend(to_duration(ms) for ms in shifted)
    return policy

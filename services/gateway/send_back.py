"""SendBack: a consumer failed to consume a message (RocketMQ's CONSUMER_SEND_MSG_BACK).

1. the message is read from the master of the broker it was pulled from, by its msg id
   (the id holds the commitlog offset; the record read must carry the same id);
2. the group's config comes from that storage (``Storage.GetGroup``: its retry maximum
   and policy, the retry topic's queues; a storage without group configs yet answers
   UNIMPLEMENTED and the defaults apply);
3. past the maximum (the message's reconsume times >= the request's
   ``max_reconsume_times`` when > 0, else the group's ``retry_max_times``), or with delay
   level -1, the copy goes to ``%DLQ%<group>`` queue 0 (created on first use on that
   broker: 1 queue, perm 2, write-only); otherwise to ``%RETRY%<group>`` (a queue chosen
   round robin), delayed through the schedule topic or the timer (send_back_copy.py);
4. one ``Storage.Append`` on that master writes it.

The broker's delay level table (and timer precision) come from its dispatch's
``GetStatus().delivery``, cached for TABLE_CACHE_S; a dispatch that reports none (older,
or unreachable) means the default table.
"""

from __future__ import annotations

import itertools
import logging
import time

import grpc

from services.gateway.brokers import BrokerChannels, broker_error
from services.gateway.options import GatewayConfig
from services.gateway.routes import Member, RouteCache, masters_of
from services.gateway.send_back_copy import (
    Delay,
    dead_letter_copy,
    original_topic,
    retry_copy,
    retry_delay,
)
from services.gateway.validate import check_broker_name, check_group, invalid
from tide.files import ConfigFormatError
from tide.format import (
    DEFAULT_DELAY_LEVEL_TABLE,
    DEFAULT_RETRY_MAX_TIMES,
    DEFAULT_RETRY_QUEUE_NUMS,
    DEFAULT_TIMER_PRECISION_MS,
    DLQ_QUEUE_NUMS,
    MAX_RETRY_MAX_TIMES,
    CustomizedRetryPolicy,
    DelayLevelError,
    DelayLevelTable,
    ExponentialRetryPolicy,
    GroupRetryPolicy,
    MessageIdError,
    RetryPolicyType,
    dlq_topic,
    parse_msg_id,
    retry_topic,
    should_dead_letter,
)
from tide.limits import MSG_ID_MAX_CHARS
from tide.naming import topic_error
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

log = logging.getLogger("tide.gateway.send_back")

TABLE_CACHE_S = 30.0
MAX_CACHED_TABLES = 1024
VALID_TIMER_PRECISIONS_MS = (100, 200, 500, 1000)  # the timer wheel's (tide.format)
PERM_READ_WRITE = 6
PERM_WRITE_ONLY = 2  # a dead-letter topic: consumers may not pull it (BrowseQueue may)
# Groups counted by name in tide_gateway_send_back_total; later ones count as "other".
MAX_COUNTED_GROUPS = 1024
OTHER_GROUP = "other"


class SendBacks:
    def __init__(self, config: GatewayConfig, routes: RouteCache, channels: BrokerChannels) -> None:
        self._config = config
        self._routes = routes
        self._channels = channels
        self._round_robin = itertools.count()
        # dispatch address -> (monotonic time fetched, table, timer precision ms)
        self._tables: dict[str, tuple[float, DelayLevelTable, int]] = {}
        self._groups_unsupported_logged = False
        # (group, outcome) -> send-backs, for tide_gateway_send_back_total.
        self.totals: dict[tuple[str, str], int] = {}

    async def send_back(self, request: pb.SendBackRequest) -> pb.SendBackResponse:
        _check(request)
        master = await self._master(request.broker_name)
        stored = await self._read(master, request.msg_id)
        group = await self._group(master, request.consumer_group)
        max_times = request.max_reconsume_times or group.retry_max_times
        if request.delay_level == -1 or should_dead_letter(stored.reconsume_times, max_times):
            return await self._dead_letter(master, request.consumer_group, stored, max_times)
        table, precision_ms = await self._table(master)
        if request.delay_level > table.max_level:
            raise invalid(
                f"delay_level {request.delay_level} is outside broker "
                f"{quote(master.broker_name)}'s delay level table (1..{table.max_level}: "
                f"{table.text()}); give 0 for the group's retry policy or -1 for the "
                "dead-letter queue"
            )
        now_ms = int(time.time() * 1000)
        delay = retry_delay(
            group.policy, table, stored.reconsume_times, request.delay_level, now_ms
        )
        topic = retry_topic(request.consumer_group)
        queues = await self._ensure_topic(master, topic, group.retry_queue_nums, PERM_READ_WRITE)
        queue_id = next(self._round_robin) % queues
        copy = retry_copy(stored, topic, queue_id, max_times, delay, now_ms, precision_ms)
        result = await self._append(master, copy)
        self._count(request.consumer_group, "retry")
        return pb.SendBackResponse(
            topic=topic,
            reconsume_times=copy.reconsume_times,
            deliver_at_ms=_due_ms(delay, table, result.store_timestamp_ms),
            msg_id=result.msg_id,
        )

    async def _dead_letter(
        self, master: Member, group: str, stored: storage_pb.StoredMessage, max_times: int
    ) -> pb.SendBackResponse:
        topic = dlq_topic(group)
        await self._ensure_topic(master, topic, DLQ_QUEUE_NUMS, PERM_WRITE_ONLY)
        copy = dead_letter_copy(stored, topic, max_times)
        result = await self._append(master, copy)
        self._count(group, "dlq")
        log.info(
            "group %s: message %s of %s dead-lettered after %d attempts as %s",
            group,
            stored.msg_id,
            original_topic(stored),
            copy.reconsume_times,
            result.msg_id,
        )
        return pb.SendBackResponse(
            topic=topic,
            dead_lettered=True,
            reconsume_times=copy.reconsume_times,
            msg_id=result.msg_id,
        )

    # -- the broker --------------------------------------------------------------------
    async def _master(self, broker_name: str) -> Member:
        """The broker's live master: NOT_FOUND for a broker the cluster does not know,
        UNAVAILABLE while it has no master (the consumer tries again later)."""
        for refresh in (False, True):
            info = await self._routes.cluster_info(refresh=refresh)
            for member in masters_of(info):
                if member.broker_name == broker_name:
                    return member
        info = await self._routes.cluster_info()
        names = sorted({live.broker_name for live in info.brokers})
        if broker_name in names:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                f"broker {quote(broker_name)} has no live master; send the message back "
                "again when it is back (retry topics are written on the master)",
            )
        raise ServiceError(
            grpc.StatusCode.NOT_FOUND,
            f"broker_name {quote(broker_name)} is not a broker of the cluster "
            f"(brokers: {', '.join(names) or 'none'}); give the broker the message was "
            "pulled from",
        )

    async def _read(self, master: Member, msg_id: str) -> storage_pb.StoredMessage:
        try:
            _, offset = parse_msg_id(msg_id)
        except MessageIdError as exc:
            raise invalid(f"msg_id: {exc} (the msg_id of the pulled message)") from exc
        missing = ServiceError(
            grpc.StatusCode.NOT_FOUND,
            f"message {quote(msg_id)} is not on broker {quote(master.broker_name)} "
            f"({master.storage}); give the msg_id and broker_name of a pulled message",
        )
        position = storage_pb.ReadRequest.Position(physical_offset=offset, size=0)
        try:
            read: storage_pb.ReadResponse = await self._channels.storage(master.storage).Read(
                storage_pb.ReadRequest(positions=[position]),
                timeout=self._config.broker_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INVALID_ARGUMENT):
                raise missing from exc
            raise broker_error(exc, f"reading message {msg_id} from {_where(master)}") from exc
        result = read.results[0]
        if result.status != storage_pb.FOUND or result.message.msg_id.upper() != msg_id.upper():
            raise missing
        return result.message

    async def _group(self, master: Member, group: str) -> _GroupRetry:
        request = storage_pb.GetGroupRequest(group=group)
        try:
            answer: storage_pb.GetGroupResponse = await self._channels.storage(
                master.storage
            ).GetGroup(request, timeout=self._config.broker_timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise broker_error(exc, f"GetGroup {group} on {_where(master)}") from exc
            if not self._groups_unsupported_logged:
                self._groups_unsupported_logged = True
                log.warning(
                    "%s keeps no group configs (GetGroup UNIMPLEMENTED): send-back uses "
                    "the default retry policy and maximum",
                    _where(master),
                )
            return _GroupRetry()
        if not answer.found:
            return _GroupRetry()
        if not answer.group.consume_enable:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"consumer group {quote(group)} may not consume (consume_enable is false in "
                f"its config on broker {quote(master.broker_name)}); enable it first",
            )
        try:
            return _group_retry(answer.group)
        except ConfigFormatError as exc:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"consumer group {quote(group)}'s config on broker "
                f"{quote(master.broker_name)} is not usable: {exc}; update the group",
            ) from exc

    async def _table(self, master: Member) -> tuple[DelayLevelTable, int]:
        """The broker's delay level table and timer precision (cached)."""
        cached = self._tables.get(master.dispatch)
        now = time.monotonic()
        if cached is not None and now - cached[0] < TABLE_CACHE_S:
            return cached[1], cached[2]
        table, precision_ms = DEFAULT_DELAY_LEVEL_TABLE, DEFAULT_TIMER_PRECISION_MS
        if master.dispatch:
            try:
                status: dispatch_pb.DispatchStatus = await self._channels.dispatch(
                    master.dispatch
                ).GetStatus(
                    dispatch_pb.GetDispatchStatusRequest(), timeout=self._config.broker_timeout_s
                )
                if status.delivery.delay_levels_ms:
                    table = DelayLevelTable(tuple(status.delivery.delay_levels_ms))
                if status.delivery.timer_precision_ms in VALID_TIMER_PRECISIONS_MS:
                    precision_ms = status.delivery.timer_precision_ms
            except (grpc.aio.AioRpcError, DelayLevelError) as exc:
                log.warning("delay levels of %s unknown (%s): the default table", master, exc)
        if len(self._tables) >= MAX_CACHED_TABLES:
            self._tables.clear()
        self._tables[master.dispatch] = (now, table, precision_ms)
        return table, precision_ms

    async def _ensure_topic(self, master: Member, topic: str, queues: int, perm: int) -> int:
        """The topic's write queues on the master's broker, creating it there when the
        name servers do not show it (RocketMQ's createTopicInSendMessageBackMethod)."""
        for refresh in (False, True):
            try:
                view = await self._routes.get(topic, refresh=refresh)
            except ServiceError as exc:
                if exc.code is not grpc.StatusCode.NOT_FOUND:
                    raise
                continue
            data = view.queue_data.get(master.broker_name)
            if data is not None and data.write_queue_nums > 0:
                return data.write_queue_nums
        config = storage_pb.TopicConfig(
            topic_name=topic, read_queue_nums=queues, write_queue_nums=queues, perm=perm
        )
        try:
            await self._channels.storage(master.storage).UpsertTopic(
                storage_pb.UpsertTopicRequest(topic=config), timeout=self._config.broker_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise broker_error(exc, f"creating topic {topic} on {_where(master)}") from exc
        self._routes.invalidate(topic)
        log.info("created %s on broker %s (%d queues, perm %d)", topic, master, queues, perm)
        return queues

    async def _append(self, master: Member, copy: storage_pb.Message) -> storage_pb.AppendResult:
        try:
            answer: storage_pb.AppendResponse = await self._channels.storage(master.storage).Append(
                storage_pb.AppendRequest(messages=[copy]), timeout=self._config.broker_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise broker_error(exc, f"Append to {copy.topic} on {_where(master)}") from exc
        return answer.results[0]

    def _count(self, group: str, outcome: str) -> None:
        key = (group, outcome)
        if key not in self.totals and len(self.totals) >= MAX_COUNTED_GROUPS:
            key = (OTHER_GROUP, outcome)
        self.totals[key] = self.totals.get(key, 0) + 1


class _GroupRetry:
    """What send-back uses of a group's config."""

    def __init__(
        self,
        retry_max_times: int = DEFAULT_RETRY_MAX_TIMES,
        policy: GroupRetryPolicy | None = None,
        retry_queue_nums: int = DEFAULT_RETRY_QUEUE_NUMS,
    ) -> None:
        self.retry_max_times = retry_max_times
        self.policy = policy or GroupRetryPolicy()
        self.retry_queue_nums = retry_queue_nums


def _group_retry(config: storage_pb.GroupConfig) -> _GroupRetry:
    """A stored config as send-back reads it (ConfigFormatError when a value is bad)."""
    policy = config.retry_policy
    if policy.type == storage_pb.RetryPolicy.EXPONENTIAL:
        default = ExponentialRetryPolicy()
        retry = GroupRetryPolicy(
            type=RetryPolicyType.EXPONENTIAL,
            exponential=ExponentialRetryPolicy(
                initial_ms=policy.initial_ms or default.initial_ms,
                max_ms=policy.max_ms or default.max_ms,
                multiplier=policy.multiplier or default.multiplier,
            ),
        )
    elif policy.delays_ms:
        retry = GroupRetryPolicy(customized=CustomizedRetryPolicy(tuple(policy.delays_ms)))
    else:
        retry = GroupRetryPolicy()
    max_times = config.retry_max_times
    if not 0 <= max_times <= MAX_RETRY_MAX_TIMES:
        raise ConfigFormatError(f"retry_max_times is {max_times}; it must be 0..1000")
    return _GroupRetry(max_times, retry, config.retry_queue_nums or DEFAULT_RETRY_QUEUE_NUMS)


def _check(request: pb.SendBackRequest) -> None:
    check_group(request.consumer_group)
    for make, name in ((retry_topic, "retry"), (dlq_topic, "dead-letter")):
        try:
            derived = make(request.consumer_group)
        except ValueError as exc:
            raise invalid(f"consumer_group: {exc}") from exc
        error = topic_error(derived)
        if error is not None:
            raise invalid(f"consumer_group: its {name} topic is not a valid topic: {error}")
    check_broker_name(request.broker_name)
    if not request.msg_id:
        raise invalid("msg_id is empty; give the msg_id of the message pulled")
    if len(request.msg_id) > MSG_ID_MAX_CHARS:
        raise invalid(
            f"msg_id is {len(request.msg_id)} characters; the limit is {MSG_ID_MAX_CHARS}"
        )
    if request.delay_level < -1:
        raise invalid(
            f"delay_level is {request.delay_level}; give 0 (the group's retry policy), -1 "
            "(the dead-letter queue) or a level of the broker's delay level table"
        )
    if not 0 <= request.max_reconsume_times <= MAX_RETRY_MAX_TIMES:
        raise invalid(
            f"max_reconsume_times is {request.max_reconsume_times}; give 0 (the group's "
            f"retry_max_times) to {MAX_RETRY_MAX_TIMES}"
        )


def _due_ms(delay: Delay, table: DelayLevelTable, store_timestamp_ms: int) -> int:
    if delay.level > 0:
        return store_timestamp_ms + table.delays_ms[delay.level - 1]
    return delay.deliver_at_ms


def _where(member: Member) -> str:
    return f"broker {member.broker_name} ({member.storage})"

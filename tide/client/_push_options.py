"""What both push consumers (tide.client's threads, tide.client.aio's tasks) decide alike:
their options, checked, with the queue workers' settings; the group heartbeat; and the
split of a group's queues among its members."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import logging
import os
import socket
from dataclasses import dataclass

from tide.client._allocate import allocate_averagely, owners
from tide.client._convert import check_group, check_topic
from tide.client._errors import InvalidArgument
from tide.client._pull_consumer import MAX_LONG_POLL_TIMEOUT_MS, MAX_PULL_MESSAGES, check_fill
from tide.client._queue_worker import WorkerSettings
from tide.client._start_offset import ConsumeFrom
from tide.client._types import RETRY_TOPIC_PREFIX, MessageQueue
from tide.naming import topic_error
from tide.v1 import storage_pb2

_log = logging.getLogger("tide.client.consumer")

MAX_QUEUES_LIMIT = 1024
MAX_RETRIES_LIMIT = 100
MAX_RETRY_MAX_TIMES = 1000  # a group's retry_max_times limit (tide.format)
_client_ids = itertools.count()


def default_client_id() -> str:
    """``host@pid@n``: unique per consumer instance."""
    return f"{socket.gethostname()}@{os.getpid()}@{next(_client_ids)}"


@dataclass(frozen=True)
class PushOptions:
    retry_topic: str
    client_id: str
    expression: str
    takeover_delay_ms: int
    settings: WorkerSettings  # the topic's queues
    retry_settings: WorkerSettings  # the retry topic's


def push_options(
    group: str,
    topic: str,
    expression: str,
    *,
    consume_from: str | int | dt.datetime | ConsumeFrom,
    client_id: str | None,
    heartbeat_interval_ms: int,
    rebalance_interval_ms: int,
    takeover_delay_ms: int | None,
    long_poll_timeout_ms: int,
    max_messages: int,
    commit_interval_ms: int,
    min_messages: int = 0,
    min_messages_wait_ms: int = 0,
    max_retries: int,
    retry_backoff_ms: int,
    max_queues: int,
    release_timeout_ms: int,
    orderly: bool,
    max_reconsume_times: int,
    lock_interval_ms: int,
) -> PushOptions:
    """A push consumer's options checked (InvalidArgument naming the one to fix)."""
    check_group(group)
    check_topic(topic)
    check_range("max_reconsume_times", max_reconsume_times, 0, MAX_RETRY_MAX_TIMES)
    # The group's retry topic: consumed beside the topic (redeliveries).
    retry_topic = RETRY_TOPIC_PREFIX + group
    problem = topic_error(retry_topic)
    if problem is not None:
        raise InvalidArgument(
            f"group {group!r} cannot have a retry topic ({problem}); use a shorter group"
        )
    check_range("heartbeat_interval_ms", heartbeat_interval_ms, 10, 600_000)
    check_range("rebalance_interval_ms", rebalance_interval_ms, 10, 600_000)
    check_range("long_poll_timeout_ms", long_poll_timeout_ms, 0, MAX_LONG_POLL_TIMEOUT_MS)
    check_range("max_messages", max_messages, 1, MAX_PULL_MESSAGES)
    check_fill(max_messages, min_messages, min_messages_wait_ms)
    check_range("commit_interval_ms", commit_interval_ms, 0, 600_000)
    check_range("max_retries", max_retries, 0, MAX_RETRIES_LIMIT)
    check_range("retry_backoff_ms", retry_backoff_ms, 0, 600_000)
    check_range("max_queues", max_queues, 1, MAX_QUEUES_LIMIT)
    check_range("release_timeout_ms", release_timeout_ms, 0, 600_000)
    check_range("lock_interval_ms", lock_interval_ms, 10, 600_000)
    if takeover_delay_ms is None:
        # The other members notice a change within their rebalance interval (assumed
        # equal to ours) and then release (commit) at once.
        takeover_delay_ms = rebalance_interval_ms + 1_000
    check_range("takeover_delay_ms", takeover_delay_ms, 0, 600_000)
    settings = WorkerSettings(
        group=group,
        expression=expression or "*",
        consume_from=ConsumeFrom.parse(consume_from),
        max_messages=max_messages,
        long_poll_timeout_ms=long_poll_timeout_ms,
        commit_interval_ms=commit_interval_ms,
        max_retries=max_retries,
        retry_backoff_ms=retry_backoff_ms,
        error_backoff_ms=min(1_000, max(10, rebalance_interval_ms)),
        orderly=orderly,
        max_reconsume_times=max_reconsume_times,
        min_messages=min_messages,
        min_messages_wait_ms=min_messages_wait_ms,
    )
    return PushOptions(
        retry_topic=retry_topic,
        client_id=client_id or default_client_id(),
        expression=expression or "*",
        takeover_delay_ms=takeover_delay_ms,
        settings=settings,
        # A retry topic's messages are those the group failed: every one is wanted, from
        # the first (RocketMQ's computePullFromWhere starts a retry topic at 0 even for
        # CONSUME_FROM_LAST_OFFSET: a redelivery sent back before this member started
        # must not be skipped). Its pulls read at once: redeliveries are few, a fuller
        # pull would only delay them.
        retry_settings=dataclasses.replace(
            settings,
            expression="*",
            consume_from=ConsumeFrom.parse("first"),
            min_messages=0,
            min_messages_wait_ms=0,
        ),
    )


def heartbeat_request(
    group: str, client_id: str, topic: str, expression: str
) -> storage_pb2.ConsumerHeartbeatRequest:
    """A member's heartbeat: its topic and the group's retry topic."""
    return storage_pb2.ConsumerHeartbeatRequest(
        consumer_group=group,
        client_id=client_id,
        subscriptions=[
            storage_pb2.Subscription(topic=topic, expression=expression),
            storage_pb2.Subscription(topic=RETRY_TOPIC_PREFIX + group, expression="*"),
        ],
    )


def assigned(
    queues: list[MessageQueue],
    members: list[str],
    client_id: str,
    topics: tuple[str, ...],
    max_queues: int,
) -> list[MessageQueue]:
    """The queues ``client_id`` consumes: each topic's queues split on their own
    (RocketMQ rebalances per topic), at most ``max_queues`` (the rest logged)."""
    mine = [
        queue
        for topic in topics
        for queue in allocate_averagely([q for q in queues if q.topic == topic], members, client_id)
    ]
    if len(mine) > max_queues:
        _log.error(
            "consumer %s is assigned %d queues of %r but max_queues is %d; %d queues are "
            "not consumed (raise max_queues or add members)",
            client_id,
            len(mine),
            topics[0],
            max_queues,
            len(mine) - max_queues,
        )
        mine = mine[:max_queues]
    return mine


def owners_by_topic(queues: list[MessageQueue], members: list[str]) -> dict[MessageQueue, str]:
    """:func:`owners` of each topic's queues on their own (as they are allocated)."""
    result: dict[MessageQueue, str] = {}
    for topic in {queue.topic for queue in queues}:
        result.update(owners([q for q in queues if q.topic == topic], members))
    return result


def check_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"{name} is {value}; give {low}..{high}")

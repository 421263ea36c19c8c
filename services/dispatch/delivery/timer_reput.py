"""What a due timed message becomes, and its append to the real topic.

Stand-in for sched's shared re-put (``services/dispatch/delivery/reput.py`` with
``tide.format.real_destination``, decision 4 of issue 18), which was not on any branch
when the timer was written: same contract (batched, bounded, retried with backoff, never
dropping a message the storage can take). Replace the calls with sched's once both are
merged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import grpc

from services.dispatch.delivery.delivery_storage import DeliveryStorage
from tide.format import (
    DELAY,
    KEYS,
    REAL_QID,
    REAL_TOPIC,
    SYSFLAG_HOSTS_V6,
    TAGS,
    TIMER_DEL_UNIQKEY,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TIMER_DEQUEUE_MS,
    TIMER_ENQUEUE_MS,
    TIMER_OUT_MS,
    TIMER_ROLL_TIMES,
)
from tide.tail import Backoff
from tide.v1 import storage_pb2 as pb

log = logging.getLogger("tide.dispatch.timer")

# The bookkeeping of the schedule and timer topics: gone from the delivered copy
# (UNIQ_KEY stays, so that the consumer sees the id the producer was given).
_BOOKKEEPING = frozenset(
    {
        DELAY,
        REAL_TOPIC,
        REAL_QID,
        TIMER_DELIVER_MS,
        TIMER_DELAY_SEC,
        TIMER_DELAY_MS,
        TIMER_OUT_MS,
        TIMER_ENQUEUE_MS,
        TIMER_DEQUEUE_MS,
        TIMER_ROLL_TIMES,
        TIMER_DEL_UNIQKEY,
        TAGS,  # given as the Message's tags and keys
        KEYS,
    }
)
# Appends failing with these are retried (the storage is down, a slave for now, full):
# the message waits. Any other status is the message's own fault and retrying cannot help.
RETRIED = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)
APPEND_BACKOFF = Backoff(initial_s=0.1, max_s=5.0)


def due_message(stored: pb.StoredMessage) -> pb.Message | None:
    """The message to append for a due copy (None: it names no real destination)."""
    props = stored.properties
    topic = props.get(REAL_TOPIC, "")
    queue = props.get(REAL_QID, "")
    if not topic or not queue.isdigit():
        return None
    return pb.Message(
        topic=topic,
        queue_id=int(queue),
        body=stored.body,
        tags=stored.tags,
        keys=stored.keys,
        properties={k: v for k, v in props.items() if k not in _BOOKKEEPING},
        flag=stored.flag,
        born_timestamp_ms=stored.born_timestamp_ms,
        born_host=stored.born_host,
        sys_flag=stored.sys_flag & ~SYSFLAG_HOSTS_V6,
        reconsume_times=stored.reconsume_times,
    )


async def append_due(
    storage: DeliveryStorage, messages: Sequence[pb.Message], running: Callable[[], bool]
) -> int:
    """Append ``messages`` in one call, retried with backoff while the failure can pass
    (and while ``running()``); a call refused for good is split to find the message at
    fault, which alone is logged and skipped. How many were appended."""
    if not messages:
        return 0
    attempt = 0
    while True:
        try:
            await storage.append(messages)
            return len(messages)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in RETRIED:
                attempt += 1
                if attempt == 1 or attempt % 20 == 0:
                    log.warning(
                        "re-put of %d due message(s) failed (%s: %s); retrying",
                        len(messages),
                        exc.code().name,
                        exc.details(),
                    )
                if not running():
                    raise
                await asyncio.sleep(APPEND_BACKOFF.delay_s(attempt))
                continue
            if len(messages) == 1:
                log.error(
                    "due message for %s/%d refused (%s: %s); it cannot be delivered",
                    messages[0].topic,
                    messages[0].queue_id,
                    exc.code().name,
                    exc.details(),
                )
                return 0
            half = len(messages) // 2
            first = await append_due(storage, messages[:half], running)
            return first + await append_due(storage, messages[half:], running)

"""Driver-side look-ups through the gateway: queues of the topics and their offsets."""

from __future__ import annotations

from collections.abc import Sequence

from tide.client import MessageQueue, PullConsumer, QueueOffsets
from tide.spark._options import ReadOptions, signing


def queue_bounds(consumer: PullConsumer, topics: Sequence[str]) -> dict[MessageQueue, QueueOffsets]:
    """Every readable queue of ``topics`` (from the routes) with its min and max offset."""
    return {queue: consumer.offsets(queue) for topic in topics for queue in consumer.queues(topic)}


def timestamp_offsets(
    consumer: PullConsumer, queues: Sequence[MessageQueue], timestamp_ms: int
) -> dict[MessageQueue, int]:
    """The first offset stored at or after ``timestamp_ms`` in each queue (SearchOffset)."""
    return {queue: consumer.search_offset(queue, timestamp_ms) for queue in queues}


def open_consumer(options: ReadOptions) -> PullConsumer:
    return PullConsumer(
        options.group,
        options.gateway,
        tls=options.tls,
        credentials=signing(options.credentials),
    )

"""The streaming sink's exactly-once produce: each task writes through an
:class:`~tide.client.IdempotentProducer` whose id is the query's and the partition's
(``spark-<query id>-<partition>``, stable across restarts from the same checkpoint) and
whose epoch is the micro-batch id. A micro-batch run again (a crash before Spark
committed it, a task retried) sends the same rows in the same batches with the same
sequences, and the broker answers what it already stored with the original results
(or, for batches older than its window, ALREADY_EXISTS: stored), so nothing is stored
twice. The next micro-batch takes a higher epoch: the sequences start again at 0 and
the broker fences any straggler of an older one.

Queues are chosen deterministically (a replay must make the same batches): a row with a
sharding key goes to the queue its key hashes to (IdempotentProducer.queue_for, as the
gateway hashes it: a key written by this sink and by a plain producer stays on one
queue) with the key as its message group (so a FIFO topic takes it), the others to the
topic's writable queues in turn, one batch each.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace

import pyarrow as pa

from tide.client import (
    AlreadyExists,
    ClientTls,
    Credentials,
    IdempotentProducer,
    Message,
    MessageQueue,
)

log = logging.getLogger("tide.spark")

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def stream_identity() -> tuple[str, int] | None:
    """(producer id, epoch) of this streaming task, or None outside one."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return None
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
    if not query_id or not batch_id or not batch_id.isdigit():
        return None
    return f"spark-{query_id}-{context.partitionId()}", int(batch_id)


def queue_batches(
    producer: IdempotentProducer, messages: Sequence[Message]
) -> list[tuple[MessageQueue, list[Message]]]:
    """``messages`` split by queue, in order of first appearance."""
    keyed: dict[MessageQueue, list[Message]] = {}
    rest: dict[str, list[Message]] = {}
    for message in messages:
        if message.sharding_key:
            # The producer sends the key as the message group, to this queue (same hash).
            queue = producer.queue_for(message.topic, message.sharding_key)
            keyed.setdefault(queue, []).append(message)
        else:
            rest.setdefault(message.topic, []).append(message)
    batches = list(keyed.items())
    for topic, plain in rest.items():
        batches.append((producer.next_queue(topic), plain))
    return batches


def send_exactly_once(
    producer: IdempotentProducer, messages: Sequence[Message], written: dict[str, int]
) -> None:
    for queue, batch in queue_batches(producer, messages):
        try:
            producer.send_batch([m if m.sharding_key else replace(m, queue=queue) for m in batch])
        except AlreadyExists:  # stored by an earlier attempt, older than the window
            producer.skip(queue, len(batch))
            log.info("%d messages to %s were stored by an earlier attempt", len(batch), queue)
        written[queue.topic] = written.get(queue.topic, 0) + len(batch)


def write_exactly_once(
    gateway: str,
    identity: tuple[str, int],
    pieces: Iterator[list[Message]],
    written: dict[str, int],
    tls: ClientTls = False,
    credentials: Credentials | None = None,
) -> None:
    producer_id, epoch = identity
    with IdempotentProducer(
        gateway, producer_id=producer_id, epoch=epoch, tls=tls, credentials=credentials
    ) as producer:
        for messages in pieces:
            send_exactly_once(producer, messages, written)


def pieces_of(
    batches: Iterator[pa.RecordBatch], size: int, topic: str | None
) -> Iterator[list[Message]]:
    from tide.spark._writer import messages_of

    for batch in batches:
        for start in range(0, batch.num_rows, size):
            yield messages_of(batch.slice(start, size), topic)

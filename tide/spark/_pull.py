"""Executor side of the ``tide`` source: read one queue range with plain pulls."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from tide.client import ClientTls, PullConsumer, PullStatus
from tide.spark._options import CredentialsFile, signing
from tide.spark._planning import QueueRange
from tide.spark._schema import BatchBuilder

log = logging.getLogger("tide.spark")

# Rows per Arrow record batch handed to Spark.
BATCH_ROWS = 4096
# A pull that finds nothing below the planned end is tried again this long (the gateway
# planned the end from the same offsets, so this is only a lagging replica or route).
NO_DATA_WAIT_S = 10.0


class DataLossError(RuntimeError):
    """Messages of a planned range are gone (deleted by retention)."""


@dataclass
class PullPartition(InputPartition):
    """One Spark partition of the ``tide`` source: a queue range and how to reach it."""

    range: QueueRange
    gateway: str
    group: str
    expression: str
    pull_batch: int
    fail_on_data_loss: bool
    # Set for queues new in a micro-batch: start at their first message, whatever it is.
    from_first: bool = False
    tls: ClientTls = False
    credentials: CredentialsFile | None = None


def read_partition(partition: PullPartition) -> Iterator[pa.RecordBatch]:
    builder = BatchBuilder()
    with PullConsumer(
        partition.group,
        partition.gateway,
        tls=partition.tls,
        credentials=signing(partition.credentials),
    ) as consumer:
        yield from _pull_range(consumer, partition, builder)
    if len(builder):
        yield builder.flush()


def _pull_range(
    consumer: PullConsumer, partition: PullPartition, builder: BatchBuilder
) -> Iterator[pa.RecordBatch]:
    queue, offset, end = partition.range.queue, partition.range.start, partition.range.end
    waiting_since: float | None = None
    while offset < end:
        result = consumer.pull(
            queue,
            offset,
            max_messages=min(partition.pull_batch, end - offset),
            expression=partition.expression,
        )
        if result.status is PullStatus.FOUND:
            waiting_since = None
            for message in result.messages:
                if message.queue_offset >= end:
                    break
                builder.add_message(message)
            if len(builder) >= BATCH_ROWS:
                yield builder.flush()
        elif result.status is PullStatus.NO_MATCHED_MESSAGE:
            waiting_since = None
        elif result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset > offset:
            lost = min(result.next_offset, end) - offset
            if partition.fail_on_data_loss and not partition.from_first:
                raise DataLossError(
                    f"{queue}: offsets {offset}..{offset + lost - 1} are gone (the queue now "
                    f"starts at {result.min_offset}); set failOnDataLoss=false to skip them"
                )
            log.warning("%s: skipping %d lost offsets from %d", queue, lost, offset)
        else:  # NO_NEW_MESSAGE, or OFFSET_ILLEGAL above the max: not there (yet)
            now = time.monotonic()
            waiting_since = waiting_since or now
            if now - waiting_since > NO_DATA_WAIT_S:
                raise DataLossError(
                    f"{queue}: offset {offset} is planned (end {end}) but the queue ends at "
                    f"{result.max_offset} ({result.status.value})"
                )
            time.sleep(0.2)
            continue
        if result.next_offset <= offset:
            raise RuntimeError(f"{queue}: pull at {offset} did not move ({result.status.value})")
        offset = result.next_offset

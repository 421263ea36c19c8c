"""``spark.read.format("tide")``: a batch read of topics through the gateway."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from tide.client import MessageQueue, PullConsumer, QueueOffsets
from tide.spark._gateway import open_consumer, queue_bounds, timestamp_offsets
from tide.spark._options import ReadOptions
from tide.spark._planning import QueueRange, plan_ranges, resolve
from tide.spark._pull import PullPartition, read_partition


def start_offsets(
    consumer: PullConsumer, options: ReadOptions, bounds: dict[MessageQueue, QueueOffsets]
) -> dict[MessageQueue, int]:
    """startingTimestamp (SearchOffset per queue) or startingOffsets."""
    if options.starting_timestamp_ms is not None:
        return timestamp_offsets(consumer, sorted(bounds), options.starting_timestamp_ms)
    # Queues a JSON does not name start at their first message.
    return resolve(options.starting, bounds, missing="earliest")


def partitions_of(
    options: ReadOptions, ranges: Sequence[QueueRange], new_queues: frozenset[MessageQueue]
) -> list[PullPartition]:
    return [
        PullPartition(
            r,
            options.gateway,
            options.group,
            options.expression,
            options.pull_batch,
            options.fail_on_data_loss,
            r.queue in new_queues,
            options.tls,
            options.credentials,
        )
        for r in ranges
        if r.count > 0
    ]


class TideBatchReader(DataSourceReader):
    """Plans on the driver (route + each queue's min/max through the gateway); each
    partition pulls its queue range (no long polling) until its end offset."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def plan(self) -> list[QueueRange]:
        with open_consumer(self.options) as consumer:
            bounds = queue_bounds(consumer, self.options.topics)
            starts = start_offsets(consumer, self.options, bounds)
        ends = resolve(self.options.ending, bounds, missing="latest")
        return plan_ranges(starts, ends, self.options.max_per_partition)

    def partitions(self) -> Sequence[InputPartition]:
        return partitions_of(self.options, self.plan(), frozenset())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, PullPartition):
            return iter(())  # Spark's placeholder when there are no partitions
        return read_partition(partition)

"""``spark.readStream.format("tide")``: micro-batches of queue offset ranges.

The offset of a micro-batch is JSON per queue (``{"T": {"broker-a/0": 42}}``, the next
offset to read). Spark logs each batch's end offset in its checkpoint before running it;
a batch is read again after a restart from exactly the same ``[start, end)`` ranges, so
with an idempotent sink (Spark's file sink) every message lands once. Queues that appear
when a topic grows are read from their first message.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from tide.client import MessageQueue
from tide.spark._batch import partitions_of, start_offsets
from tide.spark._gateway import open_consumer, queue_bounds
from tide.spark._options import ReadOptions
from tide.spark._planning import (
    OffsetsJson,
    cap_offsets,
    from_offsets_json,
    limit_offsets,
    merge_starts,
    plan_ranges,
    to_offsets_json,
)
from tide.spark._pull import PullPartition, read_partition


class TideStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        # Trigger.AvailableNow: the max offsets when the query started.
        self.target: dict[MessageQueue, int] | None = None

    def _max_offsets(self) -> dict[MessageQueue, int]:
        with open_consumer(self.options) as consumer:
            bounds = queue_bounds(consumer, self.options.topics)
        return {queue: bound.max_offset for queue, bound in bounds.items()}

    def initialOffset(self) -> OffsetsJson:
        with open_consumer(self.options) as consumer:
            bounds = queue_bounds(consumer, self.options.topics)
            return to_offsets_json(start_offsets(consumer, self.options, bounds))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._max_offsets()

    def latestOffset(self, start: OffsetsJson, limit: ReadLimit) -> OffsetsJson:
        latest = self._max_offsets()
        if self.target is not None:
            latest = cap_offsets(latest, self.target)
        starts = merge_starts(from_offsets_json(start), latest)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        ends = limit_offsets(starts, latest, max_rows)
        # Queues gone from the route keep their offset.
        for queue, offset in starts.items():
            ends.setdefault(queue, offset)
        return to_offsets_json(ends)

    def reportLatestOffset(self) -> OffsetsJson:
        return to_offsets_json(self._max_offsets())

    def partitions(self, start: OffsetsJson, end: OffsetsJson) -> Sequence[InputPartition]:
        starts, ends = from_offsets_json(start), from_offsets_json(end)
        ranges = plan_ranges(starts, ends, self.options.max_per_partition)
        return partitions_of(self.options, ranges, frozenset(set(ends) - set(starts)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, PullPartition):
            return iter(())  # Spark's placeholder when there are no partitions
        return read_partition(partition)

    def commit(self, end: OffsetsJson) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, not in a consumer group."""

"""The rows the Tide sources produce, as a Spark schema and as Arrow record batches.

``read`` yields ``pyarrow.RecordBatch`` objects (2-3x faster than row tuples); their
schema must equal Spark's own Arrow conversion of :data:`MESSAGE_SCHEMA` (UTC
timestamps in microseconds), which :func:`arrow_schema` computes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tide.client import ReceivedMessage
from tide.format import KEYS, TAGS, DecodedRecord

# broker_name is null in the archive reader unless the option brokerName names it (the
# commitlog does not record it).
MESSAGE_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("broker_name", StringType(), True),
        StructField("queue_id", IntegerType(), False),
        StructField("queue_offset", LongType(), False),
        StructField("msg_id", StringType(), False),
        StructField("tags", StringType(), False),
        StructField("keys", ArrayType(StringType(), False), False),
        StructField("body", BinaryType(), False),
        StructField("properties", MapType(StringType(), StringType(), False), False),
        StructField("born_timestamp", TimestampType(), False),
        StructField("store_timestamp", TimestampType(), False),
    ]
)
ARCHIVE_SCHEMA = StructType(
    [*MESSAGE_SCHEMA.fields, StructField("physical_offset", LongType(), False)]
)


@cache
def arrow_schema(archive: bool = False) -> pa.Schema:
    """The Arrow schema Spark expects for :data:`MESSAGE_SCHEMA` (or the archive's)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(ARCHIVE_SCHEMA if archive else MESSAGE_SCHEMA, timezone="UTC")


@dataclass(slots=True)
class _Columns:
    """Column lists being filled for one record batch."""

    topic: list[str]
    broker_name: list[str | None]
    queue_id: list[int]
    queue_offset: list[int]
    msg_id: list[str]
    tags: list[str]
    keys: list[Sequence[str]]
    body: list[bytes]
    properties: list[list[tuple[str, str]]]
    born_us: list[int]
    store_us: list[int]
    physical_offset: list[int]

    @classmethod
    def empty(cls) -> _Columns:
        return cls([], [], [], [], [], [], [], [], [], [], [], [])

    def __len__(self) -> int:
        return len(self.topic)

    def add(
        self,
        *,
        topic: str,
        broker_name: str | None,
        queue_id: int,
        queue_offset: int,
        msg_id: str,
        tags: str,
        keys: Sequence[str],
        body: bytes,
        properties: Mapping[str, str],
        born_ms: int,
        store_ms: int,
        physical_offset: int,
    ) -> None:
        self.topic.append(topic)
        self.broker_name.append(broker_name)
        self.queue_id.append(queue_id)
        self.queue_offset.append(queue_offset)
        self.msg_id.append(msg_id)
        self.tags.append(tags)
        self.keys.append(keys)
        self.body.append(body)
        self.properties.append(list(properties.items()))
        self.born_us.append(born_ms * 1000)
        self.store_us.append(store_ms * 1000)
        self.physical_offset.append(physical_offset)

    def to_batch(self, archive: bool) -> pa.RecordBatch:
        schema = arrow_schema(archive)
        values: list[Sequence[object]] = [
            self.topic,
            self.broker_name,
            self.queue_id,
            self.queue_offset,
            self.msg_id,
            self.tags,
            self.keys,
            self.body,
            self.properties,
            self.born_us,
            self.store_us,
        ]
        if archive:
            values.append(self.physical_offset)
        arrays = [
            pa.array(column, type=field.type) for column, field in zip(values, schema, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


class BatchBuilder:
    """Collects messages or records and hands out record batches of ``batch_rows``."""

    def __init__(self, *, archive: bool = False, broker_name: str | None = None) -> None:
        self.archive = archive
        self.broker_name = broker_name
        self._columns = _Columns.empty()

    def __len__(self) -> int:
        return len(self._columns)

    def add_message(self, message: ReceivedMessage) -> None:
        self._columns.add(
            topic=message.queue.topic,
            broker_name=message.queue.broker_name,
            queue_id=message.queue.queue_id,
            queue_offset=message.queue_offset,
            msg_id=message.msg_id,
            tags=message.tags,
            keys=message.keys,
            body=message.body,
            properties=message.properties,
            born_ms=message.born_timestamp_ms,
            store_ms=message.store_timestamp_ms,
            physical_offset=message.physical_offset,
        )

    def add_record(self, record: DecodedRecord, msg_id: str) -> None:
        props = record.properties
        keys = props.get(KEYS, "")
        self._columns.add(
            topic=record.topic,
            broker_name=self.broker_name,
            queue_id=record.queue_id,
            queue_offset=record.queue_offset,
            msg_id=msg_id,
            tags=props.get(TAGS, ""),
            keys=keys.split(" ") if keys else [],
            body=record.body,
            properties=props,
            born_ms=record.born_timestamp_ms,
            store_ms=record.store_timestamp_ms,
            physical_offset=record.physical_offset,
        )

    def flush(self) -> pa.RecordBatch:
        """The rows collected so far as one batch; starts a new one."""
        batch = self._columns.to_batch(self.archive)
        self._columns = _Columns.empty()
        return batch

    def add_messages(self, messages: Iterable[ReceivedMessage]) -> None:
        for message in messages:
            self.add_message(message)

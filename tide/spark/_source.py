"""The Spark data sources: ``tide`` (topics through the gateway) and ``tide-commitlog``."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from tide.spark._archive import CommitlogReader
from tide.spark._batch import TideBatchReader
from tide.spark._options import ReadOptions
from tide.spark._schema import ARCHIVE_SCHEMA, MESSAGE_SCHEMA
from tide.spark._stream import TideStreamReader
from tide.spark._writer import TideStreamWriter, TideWriter, WriteOptions


class TideDataSource(DataSource):
    """Batch and streaming reads of topics, batch writes and a streaming sink."""

    @classmethod
    def name(cls) -> str:
        return "tide"

    def schema(self) -> StructType:
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return TideBatchReader(ReadOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TideStreamReader(ReadOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return TideWriter(WriteOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return TideStreamWriter(WriteOptions.parse(self.options, schema))


class CommitlogDataSource(DataSource):
    """Commitlog segment files read directly, one partition per segment."""

    @classmethod
    def name(cls) -> str:
        return "tide-commitlog"

    def schema(self) -> StructType:
        return ARCHIVE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return CommitlogReader(self.options)

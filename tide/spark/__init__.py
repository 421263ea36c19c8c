"""Spark connector: read and write Tide topics, read archived commitlogs (docs/spark.md).

```python
import tide.spark

tide.spark.register(spark)
df = spark.read.format("tide").option("gateway", "127.0.0.1:8081").option("topic", "T").load()
```

Needs the ``spark`` extra (``pip install 'tide[spark]'``: pyspark 4 with pyarrow) and Java 17+.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(f"tide.spark needs the spark extra (pip install 'tide[spark]'): {e}") from e

from tide.spark._planning import EARLIEST, LATEST, PlanningError, QueueRange, queue_key
from tide.spark._schema import ARCHIVE_SCHEMA, MESSAGE_SCHEMA
from tide.spark._source import CommitlogDataSource, TideDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMATS = ("tide", "tide-commitlog")


def register(spark: SparkSession) -> None:
    """Register the formats ``tide`` and ``tide-commitlog`` with ``spark``."""
    spark.dataSource.register(TideDataSource)
    spark.dataSource.register(CommitlogDataSource)


__all__ = [
    "ARCHIVE_SCHEMA",
    "EARLIEST",
    "FORMATS",
    "LATEST",
    "MESSAGE_SCHEMA",
    "CommitlogDataSource",
    "PlanningError",
    "QueueRange",
    "TideDataSource",
    "queue_key",
    "register",
]

"""Two streaming queries in one process, one JVM (the SIGKILL test kills it mid-stream):
topic -> Parquet file sink (the tide source's exactly-once) and topic -> topic through the
tide sink (the sink's). One child instead of one per claim: a JVM start is the slow part.

``python -m tests.spark._kill_child GATEWAY READ_TOPIC PARQUET PARQUET_CHECKPOINT
COPY_FROM COPY_TO COPY_CHECKPOINT TMP``: 20 messages per trigger, a batch every 200 ms
each, until killed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from tests.spark.conftest import spark_session

PER_TRIGGER = 20


def _read(spark: SparkSession, gateway: str, topic: str) -> DataFrame:
    return (
        spark.readStream.format("tide")
        .option("gateway", gateway)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", str(PER_TRIGGER))
        .load()
    )


def main(
    gateway: str,
    read_topic: str,
    parquet: str,
    parquet_checkpoint: str,
    copy_from: str,
    copy_to: str,
    copy_checkpoint: str,
    tmp: str,
) -> None:
    spark = spark_session(Path(tmp))
    first = (
        _read(spark, gateway, read_topic)
        .writeStream.format("parquet")
        .option("path", parquet)
        .option("checkpointLocation", parquet_checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    # A Python source starts a Python worker of its own, which must connect back within
    # Spark's fixed 10 s (PythonWorkerFactory): two starting at once on a loaded box did
    # not. The second query starts once the first has run a batch (or failed).
    while first.lastProgress is None and not first.awaitTermination(1):
        pass
    (
        _read(spark, gateway, copy_from)
        .select("body", "keys", "tags", "properties")
        .writeStream.format("tide")
        .option("gateway", gateway)
        .option("topic", copy_to)
        .option("batchSize", "7")  # several idempotent batches per task
        .option("checkpointLocation", copy_checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    print("started", flush=True)
    spark.streams.awaitAnyTermination()


if __name__ == "__main__":
    main(*sys.argv[1:9])

"""A streaming copy topic -> topic through the tide sink, in its own process (the
exactly-once sink test SIGKILLs it mid-stream).

``python -m tests.spark._sink_child GATEWAY FROM TO CHECKPOINT TMP``: 20 messages per
trigger, a batch every 200 ms, until killed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.spark.conftest import spark_session


def main(gateway: str, source: str, target: str, checkpoint: str, tmp: str) -> None:
    spark = spark_session(Path(tmp))
    query = (
        spark.readStream.format("tide")
        .option("gateway", gateway)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "20")
        .load()
        .select("body", "keys", "tags", "properties")
        .writeStream.format("tide")
        .option("gateway", gateway)
        .option("topic", target)
        .option("batchSize", "7")  # several idempotent batches per task
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:6])

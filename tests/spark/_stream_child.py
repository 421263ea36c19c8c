"""A streaming query in its own process (tests SIGKILL it mid-stream).

``python -m tests.spark._stream_child GATEWAY TOPIC SINK CHECKPOINT TMP``: topic -> Parquet
file sink, 20 messages per trigger, a batch every 200 ms, until killed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.spark.conftest import spark_session


def main(gateway: str, topic: str, sink: str, checkpoint: str, tmp: str) -> None:
    spark = spark_session(Path(tmp))
    query = (
        spark.readStream.format("tide")
        .option("gateway", gateway)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "20")
        .load()
        .writeStream.format("parquet")
        .option("path", sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:6])

"""An example Spark pipeline on Tide (docs/spark.md): topic -> Parquet table -> aggregates
-> another topic.

1. A streaming query (Trigger.AvailableNow, with a checkpoint) appends every new order
   of the source topic to a Parquet table. Run it again later and it continues where it
   stopped: each message lands in the table exactly once.
2. A batch job reads the table, totals the orders per customer and writes one message
   per customer (JSON body, the customer as key) to the target topic.

    python examples/spark_pipeline.py --gateway 127.0.0.1:8081 \\
        --source Orders --target OrderStats --workdir /tmp/tide-pipeline --demo-orders 1000

``--demo-orders N`` first sends N made-up orders ({"customer": "c7", "amount": 12.5})
to the source topic. Needs ``pip install 'tide[spark]'`` and Java 17+.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import tide.spark
from tide.client import Message, Producer

ORDER_SCHEMA = "customer string, amount double"


def send_demo_orders(gateway: str, topic: str, count: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    with Producer(gateway) as producer:
        for start in range(0, count, 1000):
            batch = [
                Message(
                    topic,
                    json.dumps({"customer": f"c{rng.randrange(10)}", "amount": i % 50 + 0.5}),
                    tags="order",
                    keys=[f"order-{i}"],
                )
                for i in range(start, min(start + 1000, count))
            ]
            producer.send_batch(batch)


def ingest(spark: SparkSession, gateway: str, source: str, table: Path, checkpoint: Path) -> None:
    """Stage 1: every message not yet in the table, appended to it (exactly once)."""
    query = (
        spark.readStream.format("tide")
        .option("gateway", gateway)
        .option("topic", source)
        .option("startingOffsets", "earliest")  # the first run only; then the checkpoint
        .option("maxMessagesPerTrigger", "50000")
        .load()
        .select("msg_id", "queue_id", "queue_offset", "store_timestamp", "keys", "body")
        .writeStream.format("parquet")
        .option("path", str(table))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"ingest failed: {query.exception()}")


def totals(spark: SparkSession, table: Path) -> DataFrame:
    """Stage 2: orders per customer from the table."""
    orders = spark.read.parquet(str(table)).select(
        F.from_json(F.col("body").cast("string"), ORDER_SCHEMA).alias("order")
    )
    return orders.groupBy("order.customer").agg(
        F.count("*").alias("orders"), F.round(F.sum("order.amount"), 2).alias("amount")
    )


def publish(stats: DataFrame, gateway: str, target: str) -> None:
    """Stage 3: one message per customer: JSON body, the customer as key, tag "stats"."""
    (
        stats.select(
            F.to_json(F.struct("customer", "orders", "amount")).alias("body"),
            F.array("customer").alias("keys"),
            F.lit("stats").alias("tags"),
        )
        .write.format("tide")
        .option("gateway", gateway)
        .option("topic", target)
        .mode("append")
        .save()
    )


def run_pipeline(
    spark: SparkSession, gateway: str, source: str, target: str, workdir: Path
) -> DataFrame:
    tide.spark.register(spark)
    table = workdir / "orders"
    ingest(spark, gateway, source, table, workdir / "checkpoints" / "orders")
    stats = totals(spark, table).cache()
    publish(stats, gateway, target)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", default="127.0.0.1:8081")
    parser.add_argument("--source", default="Orders")
    parser.add_argument("--target", default="OrderStats")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tide-pipeline"))
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--demo-orders", type=int, default=0, metavar="N")
    args = parser.parse_args()
    if args.demo_orders:
        send_demo_orders(args.gateway, args.source, args.demo_orders)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("tide-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    try:
        stats = run_pipeline(spark, args.gateway, args.source, args.target, args.workdir)
        stats.orderBy("customer").show()
        print(f"wrote {stats.count()} customer totals to {args.target}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()

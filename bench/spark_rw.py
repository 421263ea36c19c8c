"""Spark connector benchmark: rows/s written and read (through the gateway and from the
commitlog files).

    python -m bench.spark_rw                       # 100,000 rows of 128 bytes, ~1 min
    python -m bench.spark_rw --rows 20000 --queues 2 --out /tmp/spark_rw.json

Starts a cluster of real processes (name server, one broker, gateway; tests/_cluster.py)
on a fresh store under a temporary directory and a local Spark (``--master``,
``local[2]``), then times, after a warm-up on a small topic:

* ``write``: ``df.write.format("tide")`` of ``--rows`` rows (body of ``--body-bytes``
  bytes, one key, a tag) from ``--partitions`` Spark partitions (batches of 1,000);
* ``read_gateway``: ``spark.read.format("tide")`` of the topic into the ``noop`` sink
  (every row materialised, nothing collected), one partition per queue;
* ``read_archive``: ``spark.read.format("tide-commitlog")`` of the broker's commitlog
  into the ``noop`` sink, one partition per segment (1 MiB segments in the test store).

JVM and Python worker start-up are not in the figures. Results go to stdout (JSON) and
to ``--out`` if given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import tide.spark
from tests._cluster import Cluster

TOPIC = "BenchSpark"


def spark_session(master: str, tmp: Path) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(master)
        .appName("tide-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.local.dir", str(tmp / "spark"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tide.spark.register(spark)
    return spark


def rows_frame(spark: SparkSession, rows: int, body_bytes: int, partitions: int) -> DataFrame:
    pad = "x" * max(body_bytes - 12, 0)
    return spark.range(0, rows, numPartitions=partitions).select(
        F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit(pad))
        .cast("binary")
        .alias("body"),
        F.array(F.concat(F.lit("k"), F.col("id").cast("string"))).alias("keys"),
        F.lit("TagA").alias("tags"),
    )


def timed(what: str, rows: int, action: Any) -> dict[str, float]:
    start = time.perf_counter()
    action()
    seconds = time.perf_counter() - start
    result = {"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds)}
    print(f"{what:>13}: {rows} rows in {seconds:.2f} s = {rows / seconds:,.0f} rows/s", flush=True)
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tide-bench-spark-") as tmp_name:
        tmp = Path(tmp_name)
        with Cluster(tmp / "cluster", brokers=1) as cluster:
            gateway = cluster.gateway.listen
            spark = spark_session(args.master, tmp)
            try:
                cluster.create_topic(TOPIC, queues=args.queues)
                cluster.create_topic(TOPIC + "Warm", queues=args.queues)

                def write(topic: str, rows: int) -> None:
                    frame = rows_frame(spark, rows, args.body_bytes, args.partitions)
                    frame.write.format("tide").option("gateway", gateway).option(
                        "topic", topic
                    ).mode("append").save()

                def read_gateway(topic: str) -> None:
                    spark.read.format("tide").option("gateway", gateway).option(
                        "topic", topic
                    ).load().write.format("noop").mode("overwrite").save()

                commitlog = cluster.broker("broker-a").master.storage_dir / "commitlog"

                def read_archive() -> None:
                    spark.read.format("tide-commitlog").load(str(commitlog)).write.format(
                        "noop"
                    ).mode("overwrite").save()

                write(TOPIC + "Warm", 2000)  # warm-up: Python workers, connections
                read_gateway(TOPIC + "Warm")
                read_archive()
                results = {
                    "write": timed("write", args.rows, lambda: write(TOPIC, args.rows)),
                    "read_gateway": timed("read_gateway", args.rows, lambda: read_gateway(TOPIC)),
                    "read_archive": timed("read_archive", args.rows + 2000, read_archive),
                }
            finally:
                spark.stop()
    return {
        "benchmark": "spark_rw",
        "command": " ".join(["python -m bench.spark_rw", *sys.argv[1:]]),
        "params": vars(args) | {"out": str(args.out) if args.out else None},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--body-bytes", type=int, default=128)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

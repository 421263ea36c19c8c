"""Streaming reads into a file sink: every message exactly once across restarts and a crash
before a commit (a SIGKILL mid-stream: test_sigkill_exactly_once.py)."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from tests._cluster import Cluster
from tests.spark.test_batch import produce
from tide.waiting import wait_until


def run_available_now(
    spark: SparkSession, gateway: str, topic: str, sink: Path, checkpoint: Path, per_trigger: int
) -> StreamingQuery:
    query = (
        spark.readStream.format("tide")
        .option("gateway", gateway)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", str(per_trigger))
        .load()
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive
    assert query.exception() is None, query.exception()
    return query


def sink_ids(spark: SparkSession, sink: Path) -> list[str]:
    # Through the sink's _spark_metadata log: files of uncommitted attempts are ignored.
    return [r.msg_id for r in spark.read.parquet(str(sink)).select("msg_id").collect()]


def last_batch(checkpoint: Path, log: str) -> int:
    return max(int(p.name) for p in (checkpoint / log).iterdir() if p.name.isdigit())


def test_restart_after_crash_before_commit_is_exactly_once(
    cluster: Cluster, spark: SparkSession, tmp_path: Path
) -> None:
    topic, gateway = "SparkStream", cluster.gateway.listen
    cluster.create_topic(topic, queues=2)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    sent = {r.msg_id for r in produce(cluster, topic, 300)}

    query = run_available_now(spark, gateway, topic, sink, checkpoint, 100)
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3
    assert sorted(sink_ids(spark, sink)) == sorted(sent)

    # More messages; then a crash after the sink wrote the batch but before Spark
    # committed it: the commit log entry is missing, so the batch runs again.
    sent |= {r.msg_id for r in produce(cluster, topic, 150)}
    run_available_now(spark, gateway, topic, sink, checkpoint, 1000)
    batch = last_batch(checkpoint, "commits")
    assert last_batch(checkpoint, "offsets") == batch
    (checkpoint / "commits" / str(batch)).unlink()
    (checkpoint / "commits" / f".{batch}.crc").unlink(missing_ok=True)  # Hadoop's checksum
    run_available_now(spark, gateway, topic, sink, checkpoint, 1000)
    ids = sink_ids(spark, sink)
    assert len(ids) == len(set(ids)) == len(sent)
    assert set(ids) == sent

    # The topic grows: the new queues are read from their first message.
    cluster.create_topic(topic, queues=4)
    # GetTopicRoute through the gateway refreshes its route cache: once it lists 8
    # queues, the gateway routes produces to them too.
    wait_until(lambda: _queue_count(cluster, topic) == 8, "8 queues in the route")
    sent |= {r.msg_id for r in produce(cluster, topic, 400, batch=25)}  # over every queue
    query = run_available_now(spark, gateway, topic, sink, checkpoint, 1000)
    rows = spark.read.parquet(str(sink)).select("msg_id", "queue_id").collect()
    assert {r.queue_id for r in rows} == {0, 1, 2, 3}
    assert len(rows) == len({r.msg_id for r in rows}) == len(sent)


def _queue_count(cluster: Cluster, topic: str) -> int:
    from tide.client import PullConsumer

    with PullConsumer("probe", cluster.gateway.listen) as consumer:
        return len(consumer.queues(topic))


def test_streaming_sink_copies_a_topic(
    cluster: Cluster, spark: SparkSession, tmp_path: Path
) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("SparkCopyFrom", queues=2)
    cluster.create_topic("SparkCopyTo", queues=1)
    sent = produce(cluster, "SparkCopyFrom", 300)
    query = (
        spark.readStream.format("tide")
        .option("gateway", gateway)
        .option("topic", "SparkCopyFrom")
        .option("startingOffsets", "earliest")
        .load()
        .select("body", "keys", "tags", "properties")
        .writeStream.format("tide")
        .option("gateway", gateway)
        .option("topic", "SparkCopyTo")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    copied = (
        spark.read.format("tide").option("gateway", gateway).option("topic", "SparkCopyTo").load()
    ).collect()
    assert len(copied) == len(sent)
    assert sorted(r.body for r in copied) == sorted(f"m-{i}".encode() for i in range(300))
    assert all(r.properties["n"] == r.body.decode()[2:] for r in copied)

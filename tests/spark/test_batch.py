"""Batch reads through the gateway and batch writes, on a real cluster."""

from __future__ import annotations

import json
import time

import pytest
from pyspark.sql import SparkSession

from tests._cluster import Cluster
from tide.client import Message, Producer, SendResult


def produce(
    cluster: Cluster, topic: str, count: int, *, tag: str = "TagA", batch: int = 500
) -> list[SendResult]:
    """``count`` messages in batches of ``batch`` (each batch goes to one queue; successive
    batches rotate over the topic's queues)."""
    results: list[SendResult] = []
    with Producer(cluster.gateway.listen) as producer:
        for start in range(0, count, batch):
            results += producer.send_batch(
                [
                    Message(
                        topic,
                        f"m-{i}".encode(),
                        tags=tag if i % 2 == 0 else "TagB",
                        keys=[f"k{i}", "x"],
                        properties={"n": str(i)},
                    )
                    for i in range(start, min(start + batch, count))
                ]
            )
    assert all(r.written for r in results)
    return results


def test_batch_read_equals_what_was_produced(cluster: Cluster, spark: SparkSession) -> None:
    cluster.create_topic("SparkBatch", queues=3)
    before_ms = int(time.time() * 1000)
    sent = produce(cluster, "SparkBatch", 900)
    df = (
        spark.read.format("tide")
        .option("gateway", cluster.gateway.listen)
        .option("topic", "SparkBatch")
        .option("maxMessagesPerPartition", "100")
        .load()
    )
    rows = df.collect()
    assert df.rdd.getNumPartitions() >= 9  # 6 queues, split by 100
    assert len(rows) == 900
    by_id = {r.msg_id: r for r in rows}
    for result in sent:
        row = by_id[result.msg_id]
        assert (row.topic, row.broker_name, row.queue_id, row.queue_offset) == (
            "SparkBatch",
            result.queue.broker_name,
            result.queue.queue_id,
            result.queue_offset,
        )
        i = int(row.body.decode().removeprefix("m-"))
        assert row.keys == [f"k{i}", "x"]
        assert row.tags == ("TagA" if i % 2 == 0 else "TagB")
        assert row.properties["n"] == str(i)
        assert row.store_timestamp.timestamp() * 1000 >= before_ms - 1000

    # a tag expression, explicit offsets per queue, and a timestamp
    tagged = (
        spark.read.format("tide")
        .option("gateway", cluster.gateway.listen)
        .option("topic", "SparkBatch")
        .option("expression", "TagA")
        .load()
    )
    assert tagged.count() == 450
    first = min(sent, key=lambda r: (r.queue, r.queue_offset)).queue
    spec = {"SparkBatch": {f"{first.broker_name}/{first.queue_id}": 10}}
    ends = {"SparkBatch": {f"{first.broker_name}/{first.queue_id}": 20}}
    ranged = (
        spark.read.format("tide")
        .option("gateway", cluster.gateway.listen)
        .option("topic", "SparkBatch")
        .option("startingOffsets", json.dumps(spec))
        .option("endingOffsets", json.dumps(ends))
        .load()
    )
    # the named queue 10..19; the others earliest..latest by default? no: ends default latest
    got = ranged.where(
        f"broker_name = '{first.broker_name}' and queue_id = {first.queue_id}"
    ).collect()
    assert sorted(r.queue_offset for r in got) == list(range(10, 20))
    late = (
        spark.read.format("tide")
        .option("gateway", cluster.gateway.listen)
        .option("topic", "SparkBatch")
        .option("startingTimestamp", str(int(time.time() * 1000) + 60_000))
        .load()
    )
    assert late.count() == 0


def test_write_then_read_back(cluster: Cluster, spark: SparkSession) -> None:
    cluster.create_topic("SparkWrite", queues=2)
    rows = [(f"body-{i}".encode(), [f"key-{i}"], "TagW", {"i": str(i)}) for i in range(2500)]
    df = spark.createDataFrame(
        rows, "body binary, keys array<string>, tags string, properties map<string,string>"
    ).repartition(3)
    (
        df.write.format("tide")
        .option("gateway", cluster.gateway.listen)
        .option("topic", "SparkWrite")
        .mode("append")
        .save()
    )
    back = (
        spark.read.format("tide")
        .option("gateway", cluster.gateway.listen)
        .option("topic", "SparkWrite")
        .load()
        .collect()
    )
    assert sorted(r.body for r in back) == sorted(r[0] for r in rows)
    assert all(r.tags == "TagW" and r.keys == [f"key-{r.properties['i']}"] for r in back)
    assert all(r.body == f"body-{r.properties['i']}".encode() for r in back)


def test_write_to_a_missing_topic_fails_the_job(cluster: Cluster, spark: SparkSession) -> None:
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="NoSuchSparkTopic"):
        (
            df.write.format("tide")
            .option("gateway", cluster.gateway.listen)
            .option("topic", "NoSuchSparkTopic")
            .mode("append")
            .save()
        )
    with pytest.raises(Exception, match="column body"):
        spark.createDataFrame([("x",)], "value string").write.format("tide").option(
            "topic", "T"
        ).mode("append").save()

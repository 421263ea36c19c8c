"""The streaming tide sink is exactly-once (tide/spark/_idempotent_sink.py): a
micro-batch run again after a crash before Spark committed it (here), or a query SIGKILLed
mid-stream and restarted from its checkpoint (test_sigkill_exactly_once.py), stores no
message twice in the target topic; with option idempotent=false the rerun batch is stored
again (what the test would see without idempotence)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from tests._cluster import Cluster
from tests.spark.test_batch import produce
from tests.spark.test_stream import last_batch
from tide.client import IdempotentProducer, Message, Producer
from tide.spark._idempotent_sink import queue_batches


def copy_available_now(
    spark: SparkSession,
    gateway: str,
    topics: tuple[str, str],
    checkpoint: Path,
    *,
    idempotent: str = "true",
) -> StreamingQuery:
    source, target = topics
    query = (
        spark.readStream.format("tide")
        .option("gateway", gateway)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "100")
        .load()
        .select("body", "keys", "tags", "properties")
        .writeStream.format("tide")
        .option("gateway", gateway)
        .option("topic", target)
        .option("batchSize", "30")
        .option("idempotent", idempotent)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive
    assert query.exception() is None, query.exception()
    return query


def target_bodies(spark: SparkSession, gateway: str, topic: str) -> Counter[bytes]:
    rows = spark.read.format("tide").option("gateway", gateway).option("topic", topic).load()
    return Counter(r.body for r in rows.select("body").collect())


def forget_last_commit(checkpoint: Path) -> None:
    """As a crash after the sink wrote the batch but before Spark committed it."""
    batch = last_batch(checkpoint, "commits")
    assert last_batch(checkpoint, "offsets") == batch
    (checkpoint / "commits" / str(batch)).unlink()
    (checkpoint / "commits" / f".{batch}.crc").unlink(missing_ok=True)


@pytest.mark.parametrize("idempotent", ["true", "false"])
def test_a_micro_batch_run_again_is_stored_once(
    cluster: Cluster, spark: SparkSession, tmp_path: Path, idempotent: str
) -> None:
    gateway = cluster.gateway.listen
    topics = (f"SinkOnceFrom{idempotent}", f"SinkOnceTo{idempotent}")
    cluster.create_topic(topics[0], queues=2)
    cluster.create_topic(topics[1], queues=2)
    produce(cluster, topics[0], 300, batch=50)
    checkpoint = tmp_path / "checkpoint"
    copy_available_now(spark, gateway, topics, checkpoint, idempotent=idempotent)
    forget_last_commit(checkpoint)
    copy_available_now(spark, gateway, topics, checkpoint, idempotent=idempotent)
    bodies = target_bodies(spark, gateway, topics[1])
    assert set(bodies) == {f"m-{i}".encode() for i in range(300)}
    duplicated = sum(count - 1 for count in bodies.values())
    if idempotent == "true":
        assert duplicated == 0
    else:  # the control: the rerun batch's messages are stored again
        assert duplicated > 0


def test_a_sharding_key_goes_to_the_queue_the_gateway_picks(cluster: Cluster) -> None:
    """The sink picks a keyed row's queue itself; a key it writes and one a plain
    producer sends stay on one queue (one hash: RocketMQ's SelectMessageQueueByHash)."""
    topic = "SinkKeyed"
    cluster.create_topic(topic, queues=4)
    keys = [f"order-{i}" for i in range(12)]
    with (
        IdempotentProducer(cluster.gateway.listen) as idempotent,
        Producer(cluster.gateway.listen) as plain,
    ):
        planned = queue_batches(idempotent, [Message(topic, b"b", sharding_key=k) for k in keys])
        for key in keys:
            [(queue, _)] = queue_batches(idempotent, [Message(topic, b"b", sharding_key=key)])
            assert plain.send(topic, b"p", sharding_key=key).queue == queue, key
        assert len({queue for queue, _ in planned}) > 1  # the keys spread over queues

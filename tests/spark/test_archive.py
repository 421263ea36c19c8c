"""The tide-commitlog reader on a store written by the storage service."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import Row, SparkSession

from tests._cluster import Cluster
from tide.client import Message, Producer, SendResult
from tide.commitlog import CommitlogLayoutError, NotAStoreError
from tide.format import ABORT_FILE, SCHEDULE_TOPIC, parse_msg_id
from tide.spark._archive import archive_segments

TOPIC = "SparkArchive"
BODY_BYTES = 4096
COUNT = 600  # ~2.5 MB: three 1 MiB segments


@pytest.fixture(scope="module")
def archived(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[SendResult]]:
    """A copy of broker-a's commitlog holding TOPIC's messages (as archived)."""
    cluster.create_topic(TOPIC, queues=2, brokers=["broker-a"])
    with Producer(cluster.gateway.listen) as producer:
        sent = producer.send_batch(
            [
                Message(TOPIC, bytes([i % 251]) * BODY_BYTES, tags="A", keys=[f"k{i}"])
                for i in range(COUNT)
            ]
        )
    assert all(r.written for r in sent)
    store = cluster.broker("broker-a").master.storage_dir
    archive = tmp_path_factory.mktemp("archive") / "commitlog"
    # The storage is running: its allocator may be preparing the next segment under a
    # temporary ``.alloc`` name (renamed when ready), which an archive leaves out.
    shutil.copytree(store / "commitlog", archive, ignore=shutil.ignore_patterns("*.alloc"))
    return archive, sent


def read(spark: SparkSession, path: Path) -> list[Row]:
    return (
        spark.read.format("tide-commitlog")
        .option("brokerName", "broker-a")
        .load(str(path))
        .where(f"topic = '{TOPIC}'")
        .collect()
    )


def copy_of(archive: Path, tmp_path: Path) -> Path:
    target = tmp_path / "commitlog"
    shutil.copytree(archive, target)
    return target


def last_segment(path: Path) -> Path:
    return max(p for p in path.iterdir() if p.name.isdigit() and p.stat().st_size and _has_data(p))


def _has_data(p: Path) -> bool:
    with p.open("rb") as f:
        return f.read(8) != b"\0" * 8


def test_reads_every_record_of_a_store(
    spark: SparkSession, archived: tuple[Path, list[SendResult]]
) -> None:
    archive, sent = archived
    df = spark.read.format("tide-commitlog").load(str(archive.parent))  # a store root works too
    assert df.rdd.getNumPartitions() == len([p for p in archive.iterdir() if p.name.isdigit()])
    rows = read(spark, archive)
    assert len(rows) == COUNT
    by_id = {r.msg_id: r for r in rows}
    for i, result in enumerate(sent):
        row = by_id[result.msg_id]
        assert row.physical_offset == parse_msg_id(result.msg_id)[1]
        assert (row.broker_name, row.queue_id, row.queue_offset) == (
            "broker-a",
            result.queue.queue_id,
            result.queue_offset,
        )
        assert row.body == bytes([i % 251]) * BODY_BYTES
        assert row.tags == "A" and row.keys == [f"k{i}"] and row.properties["KEYS"] == f"k{i}"


def test_torn_tail_stops_cleanly(
    spark: SparkSession, archived: tuple[Path, list[SendResult]], tmp_path: Path
) -> None:
    archive, sent = archived
    offsets = sorted(parse_msg_id(r.msg_id)[1] for r in sent)
    # 1. the crash shape: the last record half written, zeros after it
    zeroed = copy_of(archive, tmp_path / "zeroed")
    segment = last_segment(zeroed)
    start = int(segment.name)
    last = max(o for o in offsets if o >= start)
    size = segment.stat().st_size
    with segment.open("r+b") as f:
        f.seek(last - start + 100)
        f.write(b"\0" * (size - (last - start + 100)))
    rows = read(spark, zeroed)
    assert sorted(r.physical_offset for r in rows) == [o for o in offsets if o != last]
    # 2. an archived copy cut off in the middle of the last record
    cut = copy_of(archive, tmp_path / "cut")
    with (cut / segment.name).open("r+b") as f:
        f.truncate(last - start + 100)
    rows = read(spark, cut)
    assert sorted(r.physical_offset for r in rows) == [o for o in offsets if o != last]
    # 3. a crashed store root (abort file, no durable offset recorded): the head of the
    # last batch is zeros, its last record is whole: the write the crash interrupted
    root = tmp_path / "crashed"
    crashed = copy_of(archive, root)
    before_last = max(o for o in offsets if start <= o < last)
    with (crashed / segment.name).open("r+b") as f:
        f.seek(before_last - start)
        f.write(bytes(32))
    (root / ABORT_FILE).touch()
    rows = read(spark, crashed)
    assert sorted(r.physical_offset for r in rows) == [o for o in offsets if o < before_last]


def test_corruption_fails_loudly(
    spark: SparkSession, archived: tuple[Path, list[SendResult]], tmp_path: Path
) -> None:
    archive, sent = archived
    broken = copy_of(archive, tmp_path)
    victim = min(parse_msg_id(r.msg_id)[1] for r in sent)
    segment = max(p for p in broken.iterdir() if p.name.isdigit() and int(p.name) <= victim)
    with segment.open("r+b") as f:
        f.seek(victim - int(segment.name) + 200)  # inside the body: the CRC fails
        f.write(b"\xff\xfe")
    with pytest.raises(Exception, match="corruption at offset"):
        read(spark, broken)


def test_a_directory_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("127.0.0.1 localhost\n")
    with pytest.raises(NotAStoreError, match="is not a Tide/RocketMQ store: no commitlog/"):
        archive_segments(str(tmp_path))
    (tmp_path / "commitlog").mkdir()
    with pytest.raises(CommitlogLayoutError, match="no commitlog segment files: an empty store"):
        archive_segments(f"file://{tmp_path}")


def test_hidden_topics_are_left_out_unless_asked_for(
    spark: SparkSession, cluster: Cluster, tmp_path: Path
) -> None:
    """A delayed message waits in SCHEDULE_TOPIC_XXXX (a hidden topic): the reader leaves
    it out unless includeHidden is true."""
    topic = "SparkArchiveDelayed"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"], message_type="DELAY")
    with Producer(cluster.gateway.listen) as producer:
        (delayed,) = producer.send_batch([Message(topic, b"later", delay_level=18)])
    store = cluster.broker("broker-a").master.storage_dir
    archive = tmp_path / "commitlog"
    shutil.copytree(store / "commitlog", archive, ignore=shutil.ignore_patterns("*.alloc"))

    def topics(**options: str) -> set[str]:
        reader = spark.read.format("tide-commitlog")
        for name, value in options.items():
            reader = reader.option(name, value)
        return {row.topic for row in reader.load(str(archive)).select("topic").collect()}

    assert SCHEDULE_TOPIC not in topics()
    assert TOPIC in topics()
    with_hidden = topics(includeHidden="true")
    assert SCHEDULE_TOPIC in with_hidden and TOPIC in with_hidden
    row = (
        spark.read.format("tide-commitlog")
        .option("includeHidden", "true")
        .load(str(archive))
        .where(f"msg_id = '{delayed.msg_id}'")
        .collect()
    )
    assert [(r.topic, r.properties["REAL_TOPIC"]) for r in row] == [(SCHEDULE_TOPIC, topic)]

"""A streaming process SIGKILLed mid-stream and restarted from its checkpoints is
exactly-once on both ends: the tide source (a Parquet file sink gets every message once)
and the tide sink (tide/spark/_idempotent_sink.py: the target topic stores each message
once). One child runs both queries, so the test starts one JVM, not two."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests._cluster import Cluster
from tests.services.storage.conftest import REPO
from tests.spark._kill_child import PER_TRIGGER
from tests.spark.test_batch import produce
from tests.spark.test_sink_exactly_once import copy_available_now, target_bodies
from tests.spark.test_stream import last_batch, run_available_now, sink_ids
from tide.waiting import wait_until

# 100 triggers: the read (started first, tests/spark/_kill_child.py) must be far from done
# when the copy has committed 3 too.
READ_COUNT = 2000
COPY_COUNT = 600  # 30 triggers
# Only there to stop a hung child: a JVM start and its first batches on a loaded 2-core
# box (load average 40-55) took over 120 s.
COMMITS_TIMEOUT_S = 600


def _committed(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(p.name.isdigit() for p in commits.iterdir()) if commits.is_dir() else 0


def _start_child(gateway: str, args: list[str], tmp_path: Path) -> subprocess.Popen[bytes]:
    child_tmp = tmp_path / "child"
    child_tmp.mkdir()
    with (tmp_path / "child.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark._kill_child", gateway, *args, str(child_tmp)],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the JVM is in the group: SIGKILL takes both
        )


@pytest.mark.slow
@pytest.mark.timeout(COMMITS_TIMEOUT_S + 300)
def test_sigkill_mid_stream_then_restart_is_exactly_once_at_source_and_sink(
    cluster: Cluster, spark: SparkSession, tmp_path: Path
) -> None:
    gateway = cluster.gateway.listen
    read_topic, copy_from, copy_to = "SparkKill", "SinkKillFrom", "SinkKillTo"
    for topic in (read_topic, copy_from, copy_to):
        cluster.create_topic(topic, queues=2)
    sent = {r.msg_id for r in produce(cluster, read_topic, READ_COUNT)}
    produce(cluster, copy_from, COPY_COUNT, batch=50)
    sink, read_checkpoint = tmp_path / "sink", tmp_path / "read-checkpoint"
    copy_checkpoint = tmp_path / "copy-checkpoint"
    args = [read_topic, str(sink), str(read_checkpoint), copy_from, copy_to, str(copy_checkpoint)]
    child = _start_child(gateway, args, tmp_path)
    try:

        def both_committed_3() -> bool:
            assert child.poll() is None, (tmp_path / "child.log").read_text()[-3000:]
            return min(_committed(read_checkpoint), _committed(copy_checkpoint)) >= 3

        wait_until(
            both_committed_3,
            "the child's two queries to commit 3 batches each",
            COMMITS_TIMEOUT_S,
            interval_s=0.1,
            state=lambda: (_committed(read_checkpoint), _committed(copy_checkpoint)),
        )
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    read_batches, copy_batches = READ_COUNT // PER_TRIGGER, COPY_COUNT // PER_TRIGGER
    assert last_batch(read_checkpoint, "commits") < read_batches - 1, "the read finished first"
    assert last_batch(copy_checkpoint, "commits") < copy_batches - 1, "the copy finished first"

    run_available_now(spark, gateway, read_topic, sink, read_checkpoint, READ_COUNT)
    ids = sink_ids(spark, sink)
    assert len(ids) == len(set(ids))
    assert set(ids) == sent

    copy_available_now(spark, gateway, (copy_from, copy_to), copy_checkpoint)
    bodies = target_bodies(spark, gateway, copy_to)
    assert set(bodies) == {f"m-{i}".encode() for i in range(COPY_COUNT)}
    assert max(bodies.values()) == 1

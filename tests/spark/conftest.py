"""One Spark session (local[2], no UI) and one cluster for the Spark tests.

The JVM starts once per test session; every test uses topics of its own. The planning
tests need neither (they run without Java).

Where the time goes (measured 2026-11-27, load average 1-6, 2 cores): the session start
takes ~10 s, and the first job through a Python data source (batch or streaming, whichever
test runs first) ~8 s more than later ones (JVM warm-up; the worker's Python imports take
0.5 s). After that an availableNow restart costs ~1.5-2 s and a batch of 100 messages
0.3-0.8 s; shuffle.partitions 1 or 2 makes no difference (no shuffle in these queries).
A test's duration therefore mostly depends on whether it runs first and on the load.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests._cluster import cluster_fixture

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

cluster = cluster_fixture(brokers=2, scope="session")


def spark_session(tmp: Path) -> SparkSession:
    """A small local Spark for tests (and the child process of the SIGKILL test)."""
    from pyspark.sql import SparkSession

    import tide.spark

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tide-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.local.dir", str(tmp / "local"))
        .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
        .config("spark.sql.streaming.checkpointLocation", str(tmp / "checkpoints"))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={tmp}")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tide.spark.register(spark)
    return spark


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17+")
    session = spark_session(tmp_path_factory.mktemp("spark"))
    yield session
    session.stop()

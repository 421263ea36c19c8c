"""The example pipeline of docs/spark.md (examples/spark_pipeline.py), end to end."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from pyspark.sql import SparkSession

from tests._cluster import Cluster
from tests.services.storage.conftest import REPO


def load_example() -> ModuleType:
    path = REPO / "examples" / "spark_pipeline.py"
    spec = importlib.util.spec_from_file_location("spark_pipeline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_example_pipeline(cluster: Cluster, spark: SparkSession, tmp_path: Path) -> None:
    example = load_example()
    gateway = cluster.gateway.listen
    cluster.create_topic("ExOrders", queues=2)
    cluster.create_topic("ExStats", queues=1)
    example.send_demo_orders(gateway, "ExOrders", 500)
    example.run_pipeline(spark, gateway, "ExOrders", "ExStats", tmp_path)
    # a second run appends only what is new (here: 100 more orders)
    example.send_demo_orders(gateway, "ExOrders", 100, seed=8)
    example.run_pipeline(spark, gateway, "ExOrders", "ExStats", tmp_path)
    assert spark.read.parquet(str(tmp_path / "orders")).count() == 600

    stats = (
        spark.read.format("tide").option("gateway", gateway).option("topic", "ExStats").load()
    ).collect()
    assert len(stats) == 20  # ten customers, published by each of the two runs
    latest: dict[str, tuple[object, dict[str, object]]] = {}
    for row in stats:
        total = json.loads(row.body)
        seen = latest.get(total["customer"])
        if seen is None or row.store_timestamp > seen[0]:
            latest[total["customer"]] = (row.store_timestamp, total)
    assert sum(int(str(t["orders"])) for _, t in latest.values()) == 600
    assert all(r.tags == "stats" and r.keys == [json.loads(r.body)["customer"]] for r in stats)

"""The Spark connector over TLS: options tlsCaFile (and tls / tlsCertFile / tlsKeyFile)
reach every tide.client it opens, on the driver and in the tasks (writer and reader),
against a cluster started with TLS (tests/_cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests._cluster import Cluster
from tide.certs import make_ca, make_leaf
from tide.client import TlsFiles
from tide.spark._options import OptionError, tls_of


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, TlsFiles]]:
    root = tmp_path_factory.mktemp("spark-tls")
    authority = make_ca(root / "certs")
    leaf = make_leaf(authority, root / "certs", "service")
    files = TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(leaf.ca_file))
    with Cluster(root / "cluster", brokers=1, tls=files) as cluster:
        yield cluster, files


def test_tls_options() -> None:
    assert tls_of({}) is False
    assert tls_of({"tls": "true"}) is True
    assert tls_of({"tlsCaFile": "/ca.pem"}) == TlsFiles(ca_file="/ca.pem")
    with pytest.raises(OptionError, match="tlsCertFile and tlsKeyFile"):
        tls_of({"tlsCertFile": "/c.pem"})


def test_write_and_read_back_over_tls(
    tls_cluster: tuple[Cluster, TlsFiles], spark: SparkSession, tmp_path: Path
) -> None:
    cluster, files = tls_cluster
    cluster.create_topic("SparkTls", queues=2)
    assert files.ca_file is not None
    rows = [(f"body-{i}".encode(),) for i in range(50)]
    df = spark.createDataFrame(rows, "body binary").repartition(2)
    (
        df.write.format("tide")
        .option("gateway", cluster.gateway.listen)
        .option("tlsCaFile", files.ca_file)
        .option("topic", "SparkTls")
        .mode("append")
        .save()
    )
    read = (
        spark.read.format("tide")
        .option("gateway", cluster.gateway.listen)
        .option("tlsCaFile", files.ca_file)
        .option("topic", "SparkTls")
        .load()
    )
    assert sorted(r.body for r in read.collect()) == sorted(r[0] for r in rows)

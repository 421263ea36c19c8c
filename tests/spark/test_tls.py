"""The Spark connector over TLS with credentials: options tlsCaFile (and tls /
tlsCertFile / tlsKeyFile) and accessKey / secretKeyFile reach every tide.client it opens,
on the driver and in the tasks (writer and reader), against a cluster started with TLS
and --auth-enabled (tests/_cluster.py); without credentials the read is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrameReader, SparkSession

from tests._cluster import Cluster
from tests.auth.conftest import ADMIN, init_user_file
from tide.certs import make_ca, make_leaf
from tide.client import Admin, Credentials, PolicyEntry, TideError, TlsFiles
from tide.spark._options import CredentialsFile, OptionError, credentials_of, tls_of
from tide.waiting import wait_until

TOPIC = "SparkTls"
SPARKY = Credentials("sparky", "sparkys-secret-key-0123456789")


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, TlsFiles]]:
    root = tmp_path_factory.mktemp("spark-tls")
    authority = make_ca(root / "certs")
    leaf = make_leaf(authority, root / "certs", "service")
    files = TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(leaf.ca_file))
    with Cluster(
        root / "cluster",
        brokers=1,
        tls=files,
        storage_args=["--auth-init-user-file", str(init_user_file(root))],
        gateway_args=["--auth-enabled", "--auth-refresh-interval-ms", "200"],
    ) as cluster:
        trust = TlsFiles(ca_file=files.ca_file)

        def granted() -> bool:
            try:
                with Admin(cluster.gateway.listen, tls=trust, credentials=ADMIN) as admin:
                    admin.create_topic(TOPIC, read_queue_nums=2)
                    admin.create_user(SPARKY.access_key, SPARKY.secret_key)
                    admin.create_acl(
                        SPARKY.access_key,
                        [
                            PolicyEntry("Topic:Spark*", ["Pub", "Sub"]),
                            PolicyEntry("Group:*", ["Sub"]),
                        ],
                    )
            except TideError:
                return False
            return True

        wait_until(granted, "the admin set up sparky")
        yield cluster, files


def test_tls_and_credential_options(tmp_path: Path) -> None:
    assert tls_of({}) is False
    assert tls_of({"tls": "true"}) is True
    assert tls_of({"tlsCaFile": "/ca.pem"}) == TlsFiles(ca_file="/ca.pem")
    with pytest.raises(OptionError, match="tlsCertFile and tlsKeyFile"):
        tls_of({"tlsCertFile": "/c.pem"})
    secret = tmp_path / "secret"
    secret.write_text(SPARKY.secret_key + "\n")
    found = credentials_of({"accessKey": "sparky", "secretKeyFile": str(secret)})
    assert found == CredentialsFile("sparky", str(secret)) and found.load() == SPARKY
    assert credentials_of({}) is None
    with pytest.raises(OptionError, match="accessKey and secretKeyFile"):
        credentials_of({"accessKey": "sparky"})
    with pytest.raises(OptionError, match="give secretKeyFile"):
        credentials_of({"accessKey": "sparky", "secretKey": "in-the-plan"})
    with pytest.raises(OptionError, match="cannot read"):
        credentials_of({"accessKey": "sparky", "secretKeyFile": str(tmp_path / "none")})


def test_write_and_read_back_over_tls_with_credentials(
    tls_cluster: tuple[Cluster, TlsFiles], spark: SparkSession, tmp_path: Path
) -> None:
    cluster, files = tls_cluster
    assert files.ca_file is not None
    secret = tmp_path / "sparky.secret"
    secret.write_text(SPARKY.secret_key)
    signed = {"accessKey": SPARKY.access_key, "secretKeyFile": str(secret)}
    rows = [(f"body-{i}".encode(),) for i in range(50)]
    df = spark.createDataFrame(rows, "body binary").repartition(2)
    (
        df.write.format("tide")
        .option("gateway", cluster.gateway.listen)
        .option("tlsCaFile", files.ca_file)
        .options(**signed)
        .option("topic", TOPIC)
        .mode("append")
        .save()
    )

    def reader() -> DataFrameReader:  # options() changes a reader in place: a new one
        return (
            spark.read.format("tide")
            .option("gateway", cluster.gateway.listen)
            .option("tlsCaFile", files.ca_file)
            .option("topic", TOPIC)
        )

    read = reader().options(**signed).load()
    assert sorted(r.body for r in read.collect()) == sorted(r[0] for r in rows)
    with pytest.raises(Exception, match=r"UNAUTHENTICATED"):
        reader().load().collect()  # unsigned: refused while planning, on the driver

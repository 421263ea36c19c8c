"""The internal links' client certificates follow their files (docs/security.md,
"Rotation"): a TLS cluster's certificate, key and CA files are all replaced by ones a new
CA signed; the storage is restarted (it serves the new certificate and accepts only
clients the new CA signed). The gateway and the dispatch, not restarted, reach it again:
their new connections present the new client certificate and trust the new CA."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests._cluster import Cluster
from tide.certs import make_ca, make_leaf
from tide.client import Producer, SimpleConsumer, TideError, TlsFiles
from tide.waiting import wait_until

RELOAD = ("--tls-reload-interval-ms", "100")
TOPIC = "T_rotated_links"


def _replace(source: Path, target: str) -> None:
    """Atomically, as Kubernetes updates a mounted Secret."""
    staged = Path(f"{target}.new")
    shutil.copyfile(source, staged)
    os.replace(staged, target)


def _sent(gateway: str, trust: TlsFiles) -> str | None:
    try:
        with Producer(gateway, tls=trust) as producer:
            return producer.send(TOPIC, b"after the rotation").msg_id
    except TideError:
        return None


def test_links_reconnect_with_the_renewed_client_certificate(tmp_path: Path) -> None:
    old_ca = make_ca(tmp_path / "old", "old-ca")
    leaf = make_leaf(old_ca, tmp_path / "live", "service")
    files = TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(tmp_path / "live" / "ca.crt"))
    assert files.ca_file and files.cert_file and files.key_file
    shutil.copyfile(old_ca.cert_file, files.ca_file)
    new_ca = make_ca(tmp_path / "new", "new-ca")
    renewed = make_leaf(new_ca, tmp_path / "new", "service")
    trust = tmp_path / "both-cas.crt"  # the test's client trusts either gateway certificate
    trust.write_bytes(old_ca.cert_file.read_bytes() + new_ca.cert_file.read_bytes())
    client_tls = TlsFiles(ca_file=str(trust))

    with Cluster(
        tmp_path / "cluster",
        brokers=1,
        tls=files,
        gateway_args=RELOAD,
        storage_args=RELOAD,
        dispatch_args=RELOAD,
        nameserver_args=RELOAD,
    ) as cluster:
        cluster.create_topic(TOPIC, queues=1)
        assert _sent(cluster.gateway.listen, client_tls) is not None
        gateway_pid, dispatch_pid = cluster.gateway.proc.pid, cluster.brokers[0].dispatch.proc.pid

        _replace(renewed.key_file, files.key_file)
        _replace(renewed.cert_file, files.cert_file)
        _replace(new_ca.cert_file, files.ca_file)
        # The restarted storage trusts only the new CA: an old client certificate, or a
        # gateway still verifying against the old CA, cannot reach it.
        cluster.restart_storage(cluster.brokers[0].master)

        sent: list[str] = []

        def produced() -> bool:
            msg_id = _sent(cluster.gateway.listen, client_tls)
            if msg_id is not None:
                sent.append(msg_id)
            return bool(sent)

        wait_until(produced, "a produce through the gateway to the restarted storage")
        gateway = cluster.gateway.listen
        with SimpleConsumer("G_rotated", TOPIC, gateway=gateway, tls=client_tls) as consumer:
            received: set[str] = set()

            def consumed() -> bool:  # the dispatch tails the restarted storage again
                batch = consumer.receive(16)
                received.update(m.message.msg_id for m in batch)
                return set(sent) <= received

            wait_until(consumed, "the message produced after the rotation received")
        assert cluster.gateway.proc.pid == gateway_pid
        assert cluster.brokers[0].dispatch.proc.pid == dispatch_pid
        assert cluster.gateway.proc.poll() is None
        assert "reloaded the client TLS certificate" in cluster.gateway.stderr()

"""Certificate rotation without a restart (docs/security.md): a real name server with TLS;
its certificate files are replaced; new connections get the new certificate, the process
is the same, and a connection opened before keeps working."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from tests._cluster import tls_flags
from tests.services.nameserver.process import NameServerLauncher, NameServerProcess
from tide.certs import CertificateAuthority, certificate_serial, make_ca, make_leaf, peer_serial
from tide.tls import TlsFiles
from tide.waiting import wait_until

RELOAD_INTERVAL_MS = 100
CONNECT_TIMEOUT_S = 10.0


def served_serial(target: str, files: TlsFiles) -> int:
    """The serial of the certificate a fresh TLS handshake with ``target`` presents."""
    assert files.ca_file and files.cert_file and files.key_file
    context = ssl.create_default_context(cafile=files.ca_file)
    context.load_cert_chain(files.cert_file, files.key_file)
    context.set_alpn_protocols(["h2"])  # as a gRPC client does
    host, _, port = target.rpartition(":")
    with (
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return peer_serial(der)


@pytest.fixture
def nameserver(tmp_path: Path) -> Iterator[tuple[NameServerProcess, Path, TlsFiles]]:
    certs = tmp_path / "certs"
    authority = make_ca(certs)
    leaf = make_leaf(authority, certs, "nameserver")
    files = TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(leaf.ca_file))
    launcher = NameServerLauncher(tmp_path / "run")
    try:
        process = launcher.start(
            *tls_flags(files), "--tls-reload-interval-ms", str(RELOAD_INTERVAL_MS)
        )
        process.use_tls(files)
        yield process, certs, files
    finally:
        launcher.close()


def test_new_connections_get_the_replaced_certificate(
    nameserver: tuple[NameServerProcess, Path, TlsFiles],
) -> None:
    process, certs, files = nameserver
    assert files.cert_file is not None
    first = certificate_serial(Path(files.cert_file))
    assert served_serial(process.listen, files) == first
    # The harness channel, connected before the rotation.
    health = process.channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    assert health(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING

    authority = CertificateAuthority(certs / "tide-ca.crt", certs / "tide-ca.key")
    make_leaf(authority, certs, "nameserver")  # the same files, a new certificate
    second = certificate_serial(Path(files.cert_file))
    assert second != first

    wait_until(
        lambda: served_serial(process.listen, files) == second,
        "a new connection presented the new certificate",
    )
    assert process.proc.poll() is None and process.ready["pid"] == process.proc.pid
    # The connection opened before the rotation still serves calls.
    assert health(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
    assert "reloaded the TLS certificate" in process.stderr()

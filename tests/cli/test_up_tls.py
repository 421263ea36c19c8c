"""``tide up --tls``: a throwaway CA and certificate under the store dir, every service on
TLS (mutual between them), clients connect with the printed CA; plaintext is refused."""

from __future__ import annotations

import os
import signal
import ssl
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.cli.test_up import ANY_PORT, console_page, read_endpoints, running_up, up_command
from tide.client import Admin, Producer, TlsFiles
from tide.tls import channel_credentials

HEALTH_TIMEOUT_S = 10.0


def check(target: str, credentials: grpc.ChannelCredentials | None) -> int:
    channel = (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=HEALTH_TIMEOUT_S).status)


def test_up_tls_serves_tls_only_and_clients_connect_with_its_ca(tmp_path: Path) -> None:
    root = tmp_path / "tide"
    stderr_path = tmp_path / "up.stderr"
    with running_up(up_command(root, "--tls", *ANY_PORT), stderr_path) as proc:
        endpoints = read_endpoints(proc, stderr_path)
        tls_dir = root / "tls"
        files = TlsFiles(
            str(tls_dir / "tide-up-cluster.crt"),
            str(tls_dir / "tide-up-cluster.key"),
            str(tls_dir / "tide-up-ca.crt"),
        )
        assert (tls_dir / "tide-up-cluster.key").stat().st_mode & 0o077 == 0
        gateway = endpoints["gateway"]
        ca_only = TlsFiles(ca_file=files.ca_file)
        with Admin(gateway, tls=ca_only) as admin:
            admin.create_topic("T_up_tls", read_queue_nums=1)
        with Producer(gateway, tls=ca_only) as producer:
            assert producer.send("T_up_tls", "over TLS").msg_id
        serving = health_pb2.HealthCheckResponse.SERVING
        for name in ("nameserver", "storage", "dispatch"):
            assert check(endpoints[name], channel_credentials(files)) == serving, name
            with pytest.raises(grpc.RpcError):
                check(endpoints[name], channel_credentials(ca_only))  # no client certificate
        with pytest.raises(grpc.RpcError):
            check(gateway, None)  # plaintext
        # The console serves HTTPS with the cluster's certificate, and reaches the gateway.
        https = ssl.create_default_context(cafile=files.ca_file)
        assert "broker-a" in console_page(endpoints["console"], "/cluster", https)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0, stderr_path.read_text()

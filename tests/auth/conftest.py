"""A one-broker cluster with authentication on, its first (super) user, and signed stubs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests._cluster import Cluster
from tide.auth.client import Credentials, signed_channel
from tide.v1 import gateway_pb2_grpc as pb_grpc

ADMIN = Credentials("admin", "admin-secret-0123456789")
REFRESH_MS = 200


def init_user_file(root: Path) -> Path:
    path = root / "admin.json"
    path.write_text(json.dumps({"username": ADMIN.access_key, "password": ADMIN.secret_key}))
    return path


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("auth")
    with Cluster(
        root,
        brokers=1,
        storage_args=["--auth-init-user-file", str(init_user_file(root))],
        gateway_args=["--auth-enabled", "--auth-refresh-interval-ms", str(REFRESH_MS)],
    ) as cluster:
        yield cluster


def stub_as(cluster: Cluster, credentials: Credentials | None) -> pb_grpc.GatewayStub:
    """A Gateway stub signing with ``credentials`` (None: unsigned)."""
    channel: grpc.Channel = cluster.gateway.channel
    return pb_grpc.GatewayStub(signed_channel(channel, credentials))

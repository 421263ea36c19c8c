"""The v2 protocol's tests run against a real cluster (tests/_cluster.py) with one broker;
the dispatch checks transactions every second (the orphan test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests._cluster import Cluster, cluster_fixture
from tide.rocketmq_v2 import service_pb2_grpc as v2_grpc

cluster = cluster_fixture(
    brokers=1,
    dispatch_args=("--transaction-check-interval-ms", "1000"),
)

RPC_TIMEOUT_S = 20.0


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)
    return f"V2_{name}"[:100]


@pytest.fixture
def v2_stub(cluster: Cluster) -> Iterator[v2_grpc.MessagingServiceStub]:
    with grpc.insecure_channel(cluster.gateway.listen) as channel:
        yield v2_grpc.MessagingServiceStub(channel)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The official client's HOME (its ~/logs)."""
    return tmp_path / "home"

"""The gateway's integration tests run against a real cluster (tests/_cluster.py): one
name server, two brokers (storage + dispatch each) and a gateway, shared by a module."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from tests._cluster import cluster_fixture

cluster = cluster_fixture(brokers=2)

RPC_TIMEOUT_S = 20.0


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test (valid charset, at most 100 bytes)."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)
    return f"T_{name}"[:100]


def expect_error(code: grpc.StatusCode, run: Callable[[], object], *fragments: str) -> str:
    """``run`` fails with ``code`` and a message containing every fragment; returns the
    message."""
    with pytest.raises(grpc.RpcError) as info:
        run()
    error = info.value
    assert isinstance(error, grpc.Call), error
    details = error.details() or ""
    assert error.code() is code, f"expected {code.name}, got {error.code().name}: {details}"
    for fragment in fragments:
        assert fragment in details, f"{fragment!r} not in the error message {details!r}"
    return details

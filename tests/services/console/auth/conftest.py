"""A console against a gateway with authentication on: its own one-broker cluster (this
package's one cluster) with the first (super) user of tests/auth."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._cluster import Cluster
from tests.auth.conftest import REFRESH_MS, init_user_file
from tests.services.console.conftest import ConsoleProcess, start_console


@pytest.fixture(scope="package")
def auth_console_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("console-auth")
    with Cluster(
        root,
        brokers=1,
        storage_args=["--auth-init-user-file", str(init_user_file(root))],
        gateway_args=["--auth-enabled", "--auth-refresh-interval-ms", str(REFRESH_MS)],
    ) as cluster:
        yield cluster


@pytest.fixture(scope="package")
def auth_console(
    auth_console_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleProcess]:
    yield from start_console(
        tmp_path_factory.mktemp("console-auth-process"), auth_console_cluster.gateway.listen
    )

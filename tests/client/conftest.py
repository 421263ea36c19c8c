"""One cluster of real processes (name server, two brokers, gateway) for the client's
integration tests; each test uses topics and groups of its own."""

from __future__ import annotations

from tests._cluster import cluster_fixture

cluster = cluster_fixture(brokers=2, scope="session")

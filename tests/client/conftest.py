"""One cluster of real processes (name server, two brokers, gateway) for the client's
integration tests; each test uses topics and groups of its own."""

from __future__ import annotations

from tests._cluster import cluster_fixture

# Short queue-lock leases: a started storage grants no lock for one lease (orderly
# consumers wait that long), and a SIGKILLed member's queues are free one lease later.
cluster = cluster_fixture(
    brokers=2, scope="session", storage_args=("--rebalance-lock-max-live-time-ms", "3000")
)

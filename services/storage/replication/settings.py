"""Broker roles and replication settings (``--role``, ``--master``, ``--ha-*``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

MAX_SLAVES = 8  # Replicate streams a master serves at once
IDLE_HEARTBEATS = 4  # a stream silent this many heartbeat intervals is dead
# A slave's metadata sync (--metadata-sync-interval-ms): RocketMQ's SlaveSynchronize runs
# every 10 s; at least 100 ms (each sync reads every file), at most an hour.
DEFAULT_SYNC_INTERVAL_MS = 10_000
MIN_SYNC_INTERVAL_MS = 100
MAX_SYNC_INTERVAL_MS = 3_600_000


class BrokerRole(enum.Enum):
    ASYNC_MASTER = "ASYNC_MASTER"  # answers appends without waiting for a slave
    SYNC_MASTER = "SYNC_MASTER"  # answers once a slave acknowledged the records
    SLAVE = "SLAVE"  # copies its master's commitlog; refuses appends

    @property
    def is_master(self) -> bool:
        return self is not BrokerRole.SLAVE


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    role: BrokerRole
    broker_name: str
    broker_id: int
    master_address: str  # a slave's master (HOST:PORT); "" for a master
    batch_bytes: int
    heartbeat_interval_ms: int
    max_gap_bytes: int
    sync_slave_timeout_ms: int
    # A slave's metadata sync from its master (replication/metadata_sync.py).
    metadata_sync_interval_ms: int = DEFAULT_SYNC_INTERVAL_MS

    @property
    def heartbeat_s(self) -> float:
        return self.heartbeat_interval_ms / 1000

    @property
    def idle_timeout_s(self) -> float:
        """Either side ends a stream it heard nothing on for this long."""
        return IDLE_HEARTBEATS * self.heartbeat_s

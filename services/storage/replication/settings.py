"""Broker roles and replication settings (``--role``, ``--master``, ``--ha-*``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

MAX_SLAVES = 8  # Replicate streams a master serves at once
IDLE_HEARTBEATS = 4  # a stream silent this many heartbeat intervals is dead


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

    @property
    def heartbeat_s(self) -> float:
        return self.heartbeat_interval_ms / 1000

    @property
    def idle_timeout_s(self) -> float:
        """Either side ends a stream it heard nothing on for this long."""
        return IDLE_HEARTBEATS * self.heartbeat_s

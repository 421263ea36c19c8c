"""The consumer expiry scan (RocketMQ's scanNotActiveChannel for consumers): removes
members of consumer groups that stopped heartbeating, and logs each one."""

from __future__ import annotations

from services.storage.engine.consumer_manager import ConsumerManager
from tide.service_thread import ServiceThread

# RocketMQ scans every 10 s; a shorter expiry scans at least twice per expiry.
MAX_SCAN_INTERVAL_MS = 10_000


def scan_interval_ms(expiry_ms: int) -> int:
    return max(1, min(MAX_SCAN_INTERVAL_MS, expiry_ms // 2))


class ConsumerExpiryScan(ServiceThread):
    name = "storage.consumer-expiry"

    def __init__(self, consumers: ConsumerManager) -> None:
        super().__init__(scan_interval_ms(consumers.expiry_ms) / 1000)
        self._consumers = consumers

    def run_once(self) -> None:
        for group, member in self._consumers.remove_expired():
            self.log.info(
                "consumer %s of group %s expired: no heartbeat for %d ms",
                member.client_id,
                group,
                self._consumers.expiry_ms,
            )

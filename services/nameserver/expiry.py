"""The expiry scan (RocketMQ's scanNotActiveBroker): every scan interval, remove broker
members that have not registered within their heartbeat timeout, and log each one."""

from __future__ import annotations

from services.nameserver.route_info import RouteInfo
from tide.service_thread import ServiceThread


class ExpiryScan(ServiceThread):
    name = "nameserver.expiry"

    def __init__(self, routes: RouteInfo, scan_interval_ms: int) -> None:
        super().__init__(scan_interval_ms / 1000)
        self._routes = routes
        self.removed = 0

    def run_once(self) -> None:
        for live in self._routes.remove_expired():
            self.removed += 1
            self.log.warning(
                "broker %s/%s id %d at %s expired: no registration for %d ms "
                "(last at %d ms since epoch); its routes are removed",
                live.cluster_name,
                live.broker_name,
                live.broker_id,
                live.address.storage,
                live.heartbeat_timeout_ms,
                live.last_update_ms,
            )

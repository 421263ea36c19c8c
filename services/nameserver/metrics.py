"""The name server's metrics: gauges sampled on the event loop from the route table
(live broker members per cluster and role, broker names, topics)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from services.nameserver.route_info import RouteInfo
from tide.server._metrics import Sample, SampledGauges, service_meter


class NameServerMetrics:
    def __init__(self, routes: Callable[[], RouteInfo | None]) -> None:
        self._routes = routes
        self.gauges = SampledGauges(service_meter("nameserver"), self.sample)
        for name, description in (
            ("tide_nameserver_live_brokers", "live broker members (storages) by cluster and role"),
            ("tide_nameserver_broker_names", "broker names with at least one live member"),
            ("tide_nameserver_topics", "topics with a route"),
        ):
            self.gauges.gauge(name, description)

    def sample(self) -> Sample:
        routes = self._routes()
        if routes is None:
            return {}
        info = routes.cluster_info()
        members = Counter(
            (live.cluster_name, "master" if live.broker_id == 0 else "slave")
            for live in info.brokers
        )
        return {
            "tide_nameserver_live_brokers": [
                (count, {"cluster": cluster, "role": role})
                for (cluster, role), count in sorted(members.items())
            ],
            "tide_nameserver_broker_names": len({live.broker_name for live in info.brokers}),
            "tide_nameserver_topics": len(routes.topics()),
        }

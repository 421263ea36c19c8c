"""The name server: routes (``tide.v1.NameServer``) kept in memory, filled by broker
registrations and emptied by unregistrations and the expiry scan."""

from __future__ import annotations

import logging
import sys

import grpc

from services.nameserver.expiry import ExpiryScan
from services.nameserver.metrics import NameServerMetrics
from services.nameserver.options import OPTIONS, check_config
from services.nameserver.route_info import RouteInfo
from services.nameserver.servicer import NameServerServicer
from tide.server import Config, load_config, run_service
from tide.v1 import nameserver_pb2_grpc as pb_grpc

log = logging.getLogger("tide.nameserver")


class NameServerService:
    name = "tide.v1.NameServer"

    def __init__(self, config: Config) -> None:
        self._config = config
        self._routes: RouteInfo | None = None
        self._expiry: ExpiryScan | None = None
        self._metrics: NameServerMetrics | None = None
        self._servicer = NameServerServicer(self._routes_or_fail)

    def _routes_or_fail(self) -> RouteInfo:
        routes = self._routes
        if routes is None:
            raise RuntimeError("name server is not started")  # the readiness gate prevents this
        return routes

    def add_to_server(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_NameServerServicer_to_server(self._servicer, server)

    def drain(self) -> None:
        """Nothing streams: every call is unary."""

    async def start(self, endpoint: str) -> None:
        routes = RouteInfo(
            broker_expiry_ms=self._config.get_int("broker_expiry_ms"),
            max_brokers=self._config.get_int("max_brokers"),
            max_topics_per_registration=self._config.get_int("max_topics_per_registration"),
        )
        expiry = ExpiryScan(routes, self._config.get_int("scan_interval_ms"))
        expiry.start()
        self._routes, self._expiry = routes, expiry
        # Created once telemetry is configured (the meters come from its provider).
        self._metrics = NameServerMetrics(lambda: self._routes)
        self._metrics.gauges.start()

    async def stop(self) -> None:
        if self._metrics is not None:
            await self._metrics.gauges.stop()
        if self._expiry is not None:
            self._expiry.stop()
        if self._routes is not None:
            info = self._routes.cluster_info()
            log.info("routes dropped at stop: %d broker members", len(info.brokers))


def main(argv: list[str] | None = None) -> None:
    config = load_config("nameserver", OPTIONS, sys.argv[1:] if argv is None else argv)
    problem = check_config(config)
    if problem:
        print(f"tide-nameserver: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    run_service(NameServerService(config), config)

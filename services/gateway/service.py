"""The gateway: ``tide.v1.Gateway``, stateless, in front of the name servers and brokers.

Routes come from the name servers (routes.py), data from each broker's storage and
dispatch services over one reused channel per address (brokers.py).
"""

from __future__ import annotations

import logging
import sys

import grpc

from services.gateway.admin import Admin
from services.gateway.arrived import ArrivedRecords
from services.gateway.auth.admin import AuthAdmin
from services.gateway.auth.audit import Audit
from services.gateway.auth.authority import Authority
from services.gateway.auth.cache import AuthCache
from services.gateway.auth.interceptor import AuthInterceptor
from services.gateway.brokers import BrokerChannels
from services.gateway.consumers import Consumers
from services.gateway.fault import LatencyFaultTolerance
from services.gateway.long_poll import HeldPulls
from services.gateway.metrics import GatewayMetrics, OrderingTotals
from services.gateway.namesrv import NameServerClient
from services.gateway.options import OPTIONS, GatewayConfig, check_config, gateway_config
from services.gateway.pop import PopConsumers
from services.gateway.produce import Producer
from services.gateway.pull import Puller
from services.gateway.query import Querier
from services.gateway.queue_locks import QueueLocks
from services.gateway.readers import ReadMembers
from services.gateway.recall import Recaller
from services.gateway.routes import RouteCache
from services.gateway.send_back import SendBacks
from services.gateway.servicer import GatewayServicer
from services.gateway.transactions import Transactions
from services.gateway.v2.routes import V2Routes
from services.gateway.v2.send import V2Sender
from services.gateway.v2.servicer import MessagingServicer
from services.gateway.v2.telemetry import Telemetry
from tide.limits import APPEND_MAX_BYTES
from tide.rocketmq_v2 import service_pb2_grpc as v2_grpc
from tide.server import Config, load_config, run_service
from tide.v1 import gateway_pb2_grpc as pb_grpc

log = logging.getLogger("tide.gateway")


class GatewayService:
    name = "tide.v1.Gateway"
    # RocketMQ 5's protocol on the same port (services/gateway/v2, docs/rocketmq5.md).
    more_service_names = ("apache.rocketmq.v2.MessagingService",)
    # The front door: with TLS on, clients need no certificate here (they authenticate by
    # signature); storage, dispatch and name servers require one (docs/security.md).
    public_port = True
    # The public front door: users' signatures (--auth-enabled), not the cluster secret.
    public = True

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._namesrv = NameServerClient(config.namesrv, config.namesrv_timeout_s)
        self._routes = RouteCache(
            self._namesrv, config.route_refresh_interval_s, config.max_cached_topics
        )
        self._channels = BrokerChannels(config.appends_in_flight)
        self._held = HeldPulls(
            self._channels,
            max_held=config.max_held_pulls,
            recheck_interval_s=config.long_poll_recheck_interval_s,
            rpc_timeout_s=config.broker_timeout_s,
            notice_max_bytes=config.max_pull_bytes,
            arrived=ArrivedRecords(
                max_bytes=config.max_arrived_records_bytes, queue_max_bytes=config.max_pull_bytes
            ),
        )
        fault = LatencyFaultTolerance(
            enabled=config.send_latency_fault, isolation_ms=config.fault_isolation_ms
        )
        admin = Admin(config, self._routes, self._channels)
        # Reads fail over to a slave while a master is unreachable (readers.py).
        members = ReadMembers(self._channels, isolation_ms=config.fault_isolation_ms)
        producer = Producer(
            config,
            self._routes,
            self._channels,
            fault,
            admin.auto_create if config.auto_create_topics else None,
        )
        queue_locks = QueueLocks(config, self._routes, self._channels)
        transactions = Transactions(config, self._routes, self._channels)
        puller = Puller(config, self._routes, self._channels, self._held, members, queue_locks)
        send_backs = SendBacks(config, self._routes, self._channels)
        querier = Querier(config, self._routes, self._channels, members)
        consumers = Consumers(config, self._routes, self._channels, members)
        recaller = Recaller(config, self._routes, self._channels, querier)
        # POP consumption, for both wire APIs (tide.v1 Receive..., v2 ReceiveMessage...).
        pop = PopConsumers(config, self._routes, self._channels, self._held)
        self._servicer = GatewayServicer(
            producer,
            puller,
            querier,
            consumers,
            admin,
            send_backs,
            config.max_produce_in_flight_bytes,
            config.max_produce_stream_in_flight_bytes,
            recaller=recaller,
            transactions=transactions,
            queue_locks=queue_locks,
            pop=pop,
        )
        # The endpoint routes name when a client does not say how it reached us (start).
        self._own_endpoint: list[str] = []
        self._v2 = MessagingServicer(
            V2Routes(self._routes, self._own_endpoint),
            V2Sender(
                producer,
                recaller,
                self._servicer.produce_budget,
                config.max_message_body_bytes,
                self._routes,
                config.topic_message_type_check,
            ),
            Telemetry(
                admin.groups,
                transactions,
                config.max_message_body_bytes,
                config.topic_message_type_check,
            ),
            transactions,
            recaller,
            puller,
            consumers,
            pop=pop,
        )
        # Users and ACLs (issue 22): managed always; enforced with --auth-enabled.
        self._audit = Audit()
        auth_admin = AuthAdmin(admin.groups, self._audit)
        self._servicer._auth_admin = auth_admin
        self._authority = Authority(config.auth_max_skew_s)
        self._auth_cache = AuthCache(
            self._authority,
            auth_admin.state,
            config.auth_refresh_interval_s,
            tick=self._audit.sweep,
        )
        self.interceptors = (
            [AuthInterceptor(self._authority, self._audit)] if config.auth_enabled else []
        )
        # Wraps some handlers.
        self._metrics = GatewayMetrics(
            self._servicer,
            self._held,
            lambda: producer.written_bytes,
            lambda: self._held.arrived.answers,
            self._servicer.produce_streams,
            puller.budget,
            lambda: send_backs.totals,
            OrderingTotals(
                puller.refused,
                lambda: producer.halves_stored,
                lambda: transactions.checks_sent,
            ),
            held_receives=lambda: pop.holding,
            arrived_bytes=lambda: self._held.arrived.size_bytes,
        )

    def add_to_server(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_GatewayServicer_to_server(self._servicer, server)
        v2_grpc.add_MessagingServiceServicer_to_server(self._v2, server)

    async def start(self, endpoint: str) -> None:
        """Start the route refresh and the long-poll recheck. The name servers need not be
        up yet: calls answer UNAVAILABLE until one is."""
        self._own_endpoint[:] = [endpoint]
        self._routes.start()
        self._held.start()
        self._metrics.start()
        if self._config.auth_enabled:
            self._audit.register_metric()
            self._auth_cache.start()
            log.info("authentication and authorization on (docs/security.md)")
        log.info("name servers: %s", ";".join(self._config.namesrv))

    def drain(self) -> None:
        self._held.close()  # held pulls answer NO_NEW_MESSAGE now, not at their timeout
        self._servicer.drain()  # ProduceStream calls end once they answered what they read
        self._v2.drain()  # and the v2 clients' Telemetry streams

    async def stop(self) -> None:
        await self._auth_cache.stop()
        await self._metrics.stop()
        await self._held.stop()
        await self._routes.stop()
        await self._channels.close()
        await self._namesrv.close()


def main(argv: list[str] | None = None) -> None:
    config = load_config("gateway", OPTIONS, sys.argv[1:] if argv is None else argv)
    problem = check_config(config)
    if problem:
        print(f"tide-gateway: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    # Past PRODUCE_MAX_BYTES (checked first), a Produce is refused naming it, up to this.
    run_service(GatewayService(gateway_config(config)), config, max_receive_bytes=APPEND_MAX_BYTES)


__all__ = ["Config", "GatewayService", "main"]

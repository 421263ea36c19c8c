"""The storage service: the engine behind ``tide.v1.Storage``, registered as a broker with
the name servers, with the consumer group membership table."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import grpc

from services.storage import auth_rpc
from services.storage.engine.consumer_expiry import ConsumerExpiryScan
from services.storage.engine.consumer_manager import ConsumerManager
from services.storage.engine.message_store import MessageStore
from services.storage.engine.queue_locks import QueueLockManager
from services.storage.metrics import StorageMetrics
from services.storage.options import (
    OPTIONS,
    advertised_host,
    check_config,
    replication_settings,
    store_config,
)
from services.storage.registration import BrokerIdentity, BrokerRegistrar, parse_name_servers
from services.storage.replication.fresh_slave import prepare_fresh_slave
from services.storage.replication.node import Replication
from services.storage.replication.settings import BrokerRole
from services.storage.servicer import StorageServicer
from tide.limits import APPEND_MAX_BYTES
from tide.server import Config, load_config, run_service
from tide.server._framed import add_with_serializers, serialized
from tide.v1 import storage_pb2_grpc as pb_grpc

log = logging.getLogger("tide.storage")


class StorageService:
    name = "tide.v1.Storage"

    def __init__(self, config: Config) -> None:
        self._config = config
        self._store: MessageStore | None = None
        self._registrar: BrokerRegistrar | None = None
        self._replication: Replication | None = None
        self._consumers = ConsumerManager(expiry_ms=config.get_int("consumer_expiry_ms"))
        self._consumer_expiry = ConsumerExpiryScan(self._consumers)
        self._servicer = StorageServicer(
            self._store_or_fail,
            config.get_int("tail_max_chunk_bytes"),
            self._consumers,
            config.get_int("max_append_in_flight_bytes"),
            QueueLockManager(config.get_int("rebalance_lock_max_live_time_ms")),
        )
        self._metrics: StorageMetrics | None = None

    def _store_or_fail(self) -> MessageStore:
        store = self._store
        if store is None:
            raise RuntimeError("storage is not started")  # the readiness gate prevents this
        return store

    def add_to_server(self, server: grpc.aio.Server) -> None:
        # Tail and AppendStream yield their answers serialized (framed by hand).
        add_with_serializers(
            pb_grpc.add_StorageServicer_to_server,
            self._servicer,
            server,
            {"Tail": serialized, "AppendStream": serialized},
        )

    def drain(self) -> None:
        self._servicer.drain()
        if self._replication is not None:
            self._replication.drain()  # Replicate streams end; slaves reconnect later
        if self._registrar is not None:
            self._registrar.begin_stop()  # routes go away while in-flight calls finish

    def _init_user(self, store: MessageStore, role: BrokerRole) -> None:
        """The first super user (--auth-init-user-file) on a master without users."""
        path = self._config.get_optional_str("auth_init_user_file")
        if not path or role is BrokerRole.SLAVE:
            return
        try:
            if auth_rpc.init_user(store.auth, Path(path)):
                log.info("created the first (super) user from --auth-init-user-file")
        except Exception:
            store.close()  # a failed start releases what it opened
            raise

    async def start(self, endpoint: str) -> None:
        store_host = advertised_host(self._config, endpoint)
        settings = replication_settings(self._config)
        store_cfg = store_config(self._config, store_host)
        if settings.role is BrokerRole.SLAVE:
            await prepare_fresh_slave(
                store_cfg.commitlog_dir, store_cfg.segment_size_bytes, settings.master_address
            )
        store = MessageStore(store_cfg)
        await asyncio.to_thread(store.open)  # recovery can take a while; health says so
        self._init_user(store, settings.role)
        self._replication = Replication(store, settings, self._servicer.cold_reads)
        self._servicer.replication = self._replication
        self._store = store
        self._start_metrics(store)
        await self._replication.start()
        self._consumer_expiry.start()
        name_servers = parse_name_servers(self._config.get_optional_str("namesrv") or "")
        if name_servers:
            self._registrar = BrokerRegistrar(
                self._identity(store_host),
                name_servers,
                store.topics,
                register_interval_ms=self._config.get_int("register_interval_ms"),
                call_timeout_ms=self._config.get_int("register_timeout_ms"),
            )
            self._registrar.start()

    def _start_metrics(self, store: MessageStore) -> None:
        """Created once telemetry is configured (the meters come from its provider)."""
        metrics = StorageMetrics(
            lambda: self._store,
            lambda: self._replication,
            self._servicer.append_budget,
            self._servicer.queue_locks,
            self._servicer.cold_reads,
        )
        self._servicer.append_observer = metrics.appended
        store.segments.flush_observer = metrics.flushed
        metrics.gauges.start()
        self._metrics = metrics

    def _identity(self, store_host: str) -> BrokerIdentity:
        config = self._config
        return BrokerIdentity(
            cluster_name=config.get_str("cluster_name"),
            broker_name=config.get_str("broker_name"),
            broker_id=config.get_int("broker_id"),
            storage_address=store_host,
            dispatch_address=config.get_optional_str("dispatch_address") or "",
            heartbeat_timeout_ms=config.get_int("broker_heartbeat_timeout_ms"),
        )

    async def stop(self) -> None:
        if self._metrics is not None:
            await self._metrics.gauges.stop()
        if self._registrar is not None:
            await self._registrar.stop()
        self._consumer_expiry.stop()
        if self._replication is not None:
            await self._replication.stop()
        self._servicer.cold_reads.close()
        if self._store is not None:
            await asyncio.to_thread(self._store.close)


def main(argv: list[str] | None = None) -> None:
    config = load_config("storage", OPTIONS, sys.argv[1:] if argv is None else argv)
    problem = check_config(config)
    if problem:
        print(f"tide-storage: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    # An Append carries the records of any Produce the gateway accepts (tide.limits).
    run_service(StorageService(config), config, max_receive_bytes=APPEND_MAX_BYTES)

"""The dispatch service: consume queues and key index behind ``tide.v1.Dispatch``, built by
following a storage service's commitlog."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import grpc

from services.dispatch.arrivals import ArrivalHub
from services.dispatch.delivery.metrics import KIND_TIMER
from services.dispatch.delivery.reput import Reput
from services.dispatch.delivery.role import RoleWatcher
from services.dispatch.delivery.schedule import ScheduleService
from services.dispatch.delivery.timer import TimerService
from services.dispatch.dispatcher import Dispatcher, Writer
from services.dispatch.engine.dispatch_store import DispatchStore
from services.dispatch.metrics import DispatchMetrics
from services.dispatch.options import (
    OPTIONS,
    check_config,
    dispatch_config,
    pop_options,
    timer_options,
    transaction_options,
)
from services.dispatch.pop.handles import PopHandles
from services.dispatch.pop.revive import Reviver
from services.dispatch.pop.service import PopService
from services.dispatch.servicer import DispatchServicer, Running
from services.dispatch.storage_client import StorageClient
from services.dispatch.transaction.service import TransactionService
from tide.server import Config, load_config, run_service
from tide.server._framed import add_with_serializers, serialized
from tide.v1 import dispatch_pb2_grpc as pb_grpc

log = logging.getLogger("tide.dispatch")


class DispatchService:
    name = "tide.v1.Dispatch"

    def __init__(self, config: Config) -> None:
        self._config = config
        self._hub = ArrivalHub()
        self._running: Running | None = None
        self._writer: Writer | None = None
        self._servicer = DispatchServicer(self._running_or_fail, self._hub)
        self._metrics: DispatchMetrics | None = None
        self._timer: TimerService | None = None
        self._delivery_storage: StorageClient | None = None
        self._role: RoleWatcher | None = None

    def _running_or_fail(self) -> Running:
        running = self._running
        if running is None:
            raise RuntimeError("dispatch is not started")  # the readiness gate prevents this
        return running

    def add_to_server(self, server: grpc.aio.Server) -> None:
        # GetQueueEntriesStream and WatchArrivals yield their answers serialized (framed
        # by hand around the tail cache's views: answer_frames).
        add_with_serializers(
            pb_grpc.add_DispatchServicer_to_server,
            self._servicer,
            server,
            {"GetQueueEntriesStream": serialized, "WatchArrivals": serialized},
        )

    def drain(self) -> None:
        self._servicer.drain()

    async def start(self, endpoint: str) -> None:
        """Open the store, reconcile it with the storage (waiting for the storage to
        answer), then follow the commitlog in the background."""
        store = DispatchStore(dispatch_config(self._config))
        writer = Writer()
        storage = StorageClient(self._config.get_str("storage"))
        dispatcher = Dispatcher(
            store,
            storage,
            self._hub,
            writer,
            cleanup_interval_s=self._config.get_int("cleanup_interval_ms") / 1000,
            verify_body_crc=self._config.get_bool("verify_body_crc"),
            tail_cache_bytes=self._config.get_int("tail_cache_bytes"),
        )
        try:
            await writer.run(store.open)
        except BaseException:
            await storage.close()
            writer.shutdown()
            raise
        try:
            offset = await dispatcher.reconcile("starting")
        except BaseException:
            await writer.run(store.close)
            await storage.close()
            writer.shutdown()
            raise
        dispatcher.start(offset)
        self._writer = writer
        schedule = await self._start_delivery(store, dispatcher)
        assert self._role is not None  # created by _start_delivery
        transactions = TransactionService(
            queues=store.consume_queues,
            # A client (so a channel) of its own: a resolution's reads and appends never
            # wait behind a pull's Read or a burst of due delayed messages.
            storage=StorageClient(self._config.get_str("storage")),
            role=self._role,
            store_dir=store.config.store_dir,
            dispatched=lambda: store.dispatched_offset,
            options=transaction_options(self._config),
            tail_cache=dispatcher.tail_cache,
            cold_reads=self._servicer.cold_reads,
        )
        await transactions.start()
        pop = PopService(
            queues=store.consume_queues,
            # Its own channel too: receives and acks never wait behind pulls' reads.
            storage=StorageClient(self._config.get_str("storage")),
            role=self._role,
            dispatched=lambda: store.dispatched_offset,
            options=pop_options(self._config),
            tail_cache=dispatcher.tail_cache,
            cold_reads=self._servicer.cold_reads,
        )
        reviver = Reviver(pop)
        await pop.start(reviver.round)
        self._running = Running(
            store,
            storage,
            dispatcher,
            schedule,
            timer=self._timer,
            transactions=transactions,
            pop=pop,
            pop_handles=PopHandles(pop),
            reviver=reviver,
        )
        # Created once telemetry is configured (the meters come from its provider).
        self._metrics = DispatchMetrics(
            lambda: self._running,
            self._hub,
            tail_cache=dispatcher.tail_cache,
            cold_reads=self._servicer.cold_reads,
        )
        self._metrics.gauges.start()

    async def _start_delivery(
        self, store: DispatchStore, dispatcher: Dispatcher
    ) -> ScheduleService:
        """The delivery services beside the consume queues (after recovery: they read
        them), with one role watcher and one storage client for all of them."""
        # A client (so a channel) of their own: the reads the dispatch serves (up to
        # READ_MAX_BYTES an answer) then never hold up a due message's read or append.
        storage = self._delivery_storage = StorageClient(self._config.get_str("storage"))
        role = self._role = RoleWatcher(
            storage, self._config.get_int("delivery_role_check_interval_ms") / 1000
        )
        role.start()
        schedule = ScheduleService(
            queues=store.consume_queues,
            storage=storage,
            hub=self._hub,
            tail_cache=dispatcher.tail_cache,
            table=store.config.delay_levels,
            store_dir=store.config.store_dir,
            role=role,
            progress_interval_s=self._config.get_int("delivery_progress_interval_ms") / 1000,
            cold_reads=self._servicer.cold_reads,
        )
        await schedule.start()
        if self._config.get_bool("timer_enable"):
            timer = self._timer = TimerService(
                Path(self._config.get_str("store_dir")),
                timer_options(self._config),
                storage,
                role,
                Reput(storage, KIND_TIMER),
                store.consume_queues.find,
                dispatcher.tail_cache,
            )
            await timer.start()
        return schedule

    async def _stop_delivery(self, schedule: ScheduleService | None) -> None:
        if schedule is not None:
            await schedule.stop()  # saves its progress
        if self._timer is not None:
            await self._timer.stop()
        if self._role is not None:
            await self._role.stop()
        if self._delivery_storage is not None:
            await self._delivery_storage.close()

    async def stop(self) -> None:
        running, writer = self._running, self._writer
        if running is None or writer is None:
            return
        if self._metrics is not None:
            await self._metrics.gauges.stop()
        await self._stop_delivery(running.schedule)
        if running.transactions is not None:
            await running.transactions.stop()
        if running.pop is not None:
            await running.pop.stop()  # writes the pop offsets and revive progress back
        await running.dispatcher.stop()
        await self._servicer.stop_readers()
        await writer.run(running.store.close)  # after any batch still being applied
        writer.shutdown()
        await running.storage.close()
        log.info("dispatch store closed at commitlog offset %d", running.store.dispatched_offset)


def main(argv: list[str] | None = None) -> None:
    config = load_config("dispatch", OPTIONS, sys.argv[1:] if argv is None else argv)
    problem = check_config(config)
    if problem:
        print(f"tide-dispatch: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    run_service(DispatchService(config), config)

"""The dispatch service's metrics: gauges sampled on the event loop from the state
``GetStatus`` reports (nothing is added to the dispatch path), and the tail cache's.

``tide_dispatch_lag_bytes`` is the storage's max offset (as last seen, no call is made)
minus the dispatched offset; ``tide_dispatch_lag_milliseconds`` is how long the dispatch
has been behind: 0 when it had caught up at the last sample, else the time since it last
had (to the sampling interval, 1 s).

The tail cache (tail_cache.py): ``tide_dispatch_tail_cache_hits_total`` /
``..._misses_total`` count the GetQueueEntries calls asking for records that it answered
/ did not (the gateway then reads them from the storage), plain numbers the servicer adds
to; ``tide_dispatch_tail_cache_bytes`` is the memory it holds.

``tide_dispatch_cold_reads_total``: reads of consume-queue entries far behind their
queue's end (GetQueueEntries, POP receives, delay-level delivery, the transaction
service's half and op queues) that were not in memory, brought in on a cold reader's
thread (cold_entries.py) before they were read on the event loop.

The delivery services (docs/delivery.md): ``tide_dispatch_delay_pending{level}`` and
``tide_dispatch_timer_pending``, the messages each holds not delivered yet. (Their
lateness and undeliverable counts are recorded as they deliver: delivery/metrics.py.)

Transactional messages (transaction/service.py, master only):
``tide_dispatch_transactions_resolved_total{resolution}`` (``commit``, ``rollback``, and
``discard`` for a half dropped after its last check), ``tide_dispatch_transaction_checks_total``
(check-backs made: a half's check count raised and offered to its producer group's
streams), ``tide_dispatch_transaction_halves_unresolved`` (the unresolved halves held, at
most ``--transaction-halves-max``) and ``..._kept`` (of them, kept past the last check).

POP consumption (pop/, master only; no group or topic label: a broker may serve
thousands of groups, GetGroupLag / ``tide group lag`` break it down):
``tide_dispatch_pop_checkpoints_held`` (messages received and not acked yet, at most
``--pop-checkpoints-max``), ``tide_dispatch_pop_received_total`` (messages handed out),
``..._acked_total`` (resolved by Ack), ``..._revived_total`` (delivered again: retry
copies and FIFO messages moved back), ``..._dead_lettered_total`` (by revive or
ForwardToDeadLetter), and ``tide_dispatch_pop_revive_lag_milliseconds``: how long the
oldest checkpoint past its invisible time has waited for its revive (0: none due; a
healthy broker stays below ``--pop-revive-interval-ms`` + a round's work).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from opentelemetry.metrics import Meter

from services.dispatch.arrivals import ArrivalHub
from services.dispatch.servicer import Running
from services.dispatch.tail_cache import TailCache
from services.dispatch.transaction.service import TransactionService
from tide.server import ColdReads
from tide.server._metrics import (
    GaugeValue,
    Sample,
    SampledGauges,
    observable_total,
    service_meter,
)


class DispatchMetrics:
    def __init__(
        self,
        running: Callable[[], Running | None],
        hub: ArrivalHub,
        clock: Callable[[], float] = time.monotonic,
        *,
        tail_cache: TailCache | None = None,
        cold_reads: ColdReads | None = None,
    ) -> None:
        self._running = running
        self._hub = hub
        self._clock = clock
        self._caught_up_at = clock()
        self._tail_cache = tail_cache
        meter = service_meter("dispatch")
        self.gauges = SampledGauges(meter, self.sample)
        for name, description, unit in (
            ("tide_dispatch_dispatched_offset_bytes", "commitlog offset dispatched up to", "By"),
            ("tide_dispatch_durable_offset_bytes", "dispatched offset flushed to disk", "By"),
            ("tide_dispatch_storage_max_offset_bytes", "storage max offset last seen", "By"),
            ("tide_dispatch_lag_bytes", "commitlog bytes not yet dispatched", "By"),
            ("tide_dispatch_lag_milliseconds", "how long the dispatch has been behind", "ms"),
            ("tide_dispatch_consume_queues", "consume queues", "1"),
            ("tide_dispatch_consume_queue_segments", "consume queue segment files", "1"),
            ("tide_dispatch_index_files", "key index files", "1"),
            ("tide_dispatch_index_entries", "key index entries", "1"),
            (
                "tide_dispatch_arrival_watchers",
                "watches of arrivals: each gateway's WatchArrivals stream, and the dispatch's "
                "own delivery of delay-level messages (one)",
                "1",
            ),
            ("tide_dispatch_tail_reconnects", "Tail stream reconnects since start", "1"),
            ("tide_dispatch_follower_connected", "1 while the Tail stream is up", "1"),
            (
                "tide_dispatch_disk_full",
                "1 while the store's disk is full (dispatch holds its place until space is freed)",
                "1",
            ),
            # The delivery services' (docs/delivery.md): per level, and the timer's.
            ("tide_dispatch_delay_pending", "delay level messages not delivered yet", "1"),
            ("tide_dispatch_timer_pending", "timed messages filed, not delivered yet", "1"),
            (
                "tide_dispatch_transaction_halves_unresolved",
                "unresolved half messages held (at most --transaction-halves-max)",
                "1",
            ),
            (
                "tide_dispatch_transaction_halves_kept",
                "unresolved half messages kept past their last check (no longer checked)",
                "1",
            ),
        ):
            self.gauges.gauge(name, description, unit)
        if tail_cache is not None:
            self._declare_tail_cache(meter, tail_cache)
        if cold_reads is not None:
            observable_total(
                meter,
                "tide_dispatch_cold_reads_total",
                lambda: cold_reads.count,
                "Reads of consume-queue entries far behind their queue's end (GetQueueEntries, "
                "POP receives, delay-level delivery, transactions) that were not in memory, "
                "brought in with "
                "pread on a thread (the GIL free while the disk answers) instead of faulting "
                "on the event loop",
            )
        self._declare_transactions(meter)
        self._declare_pop(meter)

    def _declare_tail_cache(self, meter: Meter, cache: TailCache) -> None:
        observable_total(
            meter,
            "tide_dispatch_tail_cache_hits_total",
            lambda: cache.hits,
            "GetQueueEntries calls answered with their records from the tail cache",
        )
        observable_total(
            meter,
            "tide_dispatch_tail_cache_misses_total",
            lambda: cache.misses,
            "GetQueueEntries calls asking for records the tail cache did not all hold",
        )
        self.gauges.gauge(
            "tide_dispatch_tail_cache_bytes", "memory the tail cache holds (records)", "By"
        )

    def _declare_transactions(self, meter: Meter) -> None:
        def service() -> TransactionService | None:
            running = self._running()
            return None if running is None else running.transactions

        def resolved() -> dict[str, int]:
            found = service()
            return {} if found is None else found.resolved

        def checks() -> int:
            found = service()
            return 0 if found is None else found.checks

        observable_total(
            meter,
            "tide_dispatch_transactions_resolved_total",
            resolved,
            "half messages resolved by this dispatch: commit, rollback, or discard (after "
            "the last check)",
            label="resolution",
        )
        observable_total(
            meter,
            "tide_dispatch_transaction_checks_total",
            checks,
            "transaction check-backs made (a half's check count raised)",
        )

    def _declare_pop(self, meter: Meter) -> None:
        def totals() -> tuple[int, int, int, int]:
            running = self._running()
            if running is None or running.pop is None:
                return 0, 0, 0, 0
            acked = running.pop_handles.acked if running.pop_handles is not None else 0
            reviver = running.reviver
            revived = reviver.revived if reviver is not None else 0
            dead = reviver.dead_lettered if reviver is not None else 0
            return running.pop.received, acked, revived, dead

        for index, (name, description) in enumerate(
            (
                ("tide_dispatch_pop_received_total", "POP messages handed out (checkpoints)"),
                ("tide_dispatch_pop_acked_total", "POP messages acked"),
                (
                    "tide_dispatch_pop_revived_total",
                    "POP messages delivered again after their invisible time",
                ),
                ("tide_dispatch_pop_dead_lettered_total", "POP messages dead-lettered"),
            )
        ):
            observable_total(meter, name, _nth(totals, index), description)
        self.gauges.gauge(
            "tide_dispatch_pop_checkpoints_held",
            "POP messages received and not acked yet (at most --pop-checkpoints-max)",
            "1",
        )
        self.gauges.gauge(
            "tide_dispatch_pop_revive_lag_milliseconds",
            "how long the oldest POP checkpoint past its invisible time has waited for revive",
            "ms",
        )

    @staticmethod
    def _pop_sample(running: Running) -> Sample:
        pop = running.pop
        if pop is None:
            return {}
        state = pop.state
        return {
            "tide_dispatch_pop_checkpoints_held": len(state.held),
            "tide_dispatch_pop_revive_lag_milliseconds": state.revive_lag_ms(pop.clock_ms()),
        }

    def sample(self) -> Sample:
        running = self._running()
        if running is None:
            return {}
        status = running.store.status()
        dispatcher = running.dispatcher
        storage_max = dispatcher.storage_max_seen
        lag = max(0, (storage_max or 0) - status.dispatched_offset)
        now = self._clock()
        if lag == 0:
            self._caught_up_at = now
        behind_ms = 0 if lag == 0 else int((now - self._caught_up_at) * 1000)
        return {
            "tide_dispatch_dispatched_offset_bytes": status.dispatched_offset,
            "tide_dispatch_durable_offset_bytes": status.durable_offset,
            "tide_dispatch_storage_max_offset_bytes": storage_max or 0,
            "tide_dispatch_lag_bytes": lag,
            "tide_dispatch_lag_milliseconds": behind_ms,
            "tide_dispatch_consume_queues": status.queues,
            "tide_dispatch_consume_queue_segments": status.cq_segments,
            "tide_dispatch_index_files": status.index_files,
            "tide_dispatch_index_entries": status.index_entries,
            "tide_dispatch_arrival_watchers": self._hub.watcher_count,
            "tide_dispatch_tail_reconnects": dispatcher.tail_reconnects,
            "tide_dispatch_follower_connected": int(dispatcher.follower_state == "connected"),
            "tide_dispatch_disk_full": int(bool(status.disk_full)),
            **self._tail_cache_sample(),
            **self._delivery_sample(running),
            **self._transaction_sample(running),
            **self._pop_sample(running),
        }

    @staticmethod
    def _transaction_sample(running: Running) -> Sample:
        if running.transactions is None:
            return {}
        unresolved, kept = running.transactions.held()
        return {
            "tide_dispatch_transaction_halves_unresolved": unresolved,
            "tide_dispatch_transaction_halves_kept": kept,
        }

    @staticmethod
    def _delivery_sample(running: Running) -> Sample:
        sample: dict[str, GaugeValue] = {}
        if running.schedule is not None:
            pending = running.schedule.state().pending
            points = [(count, {"level": level}) for level, count in enumerate(pending, start=1)]
            sample["tide_dispatch_delay_pending"] = points
        if running.timer is not None:
            sample["tide_dispatch_timer_pending"] = running.timer.store.pending
        return sample

    def _tail_cache_sample(self) -> Sample:
        cache = self._tail_cache
        return {} if cache is None else {"tide_dispatch_tail_cache_bytes": cache.held_bytes}


def _nth(read: Callable[[], tuple[int, ...]], index: int) -> Callable[[], int]:
    return lambda: read()[index]

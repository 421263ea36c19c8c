"""The storage service's metrics (OpenTelemetry; ``--metrics-listen`` serves them to
Prometheus).

Hot paths (once per Append batch or per flush, never per message): appended messages and
bytes (plain totals), Append latency (one histogram record), the wait for the commitlog
append lock (a total kept under the lock the append holds anyway: its rate divided by
the rate of acquisitions is the mean wait), flush latency and the number of segment
flushes (fsync/msync) from the flush thread. Every gauge (offsets, segments, disk,
writable, replication lag) is sampled on the event loop from the state ``GetStatus``
reports, and the Append bytes in flight (``tide_storage_append_in_flight_bytes``,
``..._peak_bytes``, bounded by ``max_append_in_flight_bytes``; refusals in
``tide_storage_append_refused_total``) from the servicer's budget.

Queue locks of orderly consumers (engine/queue_locks.py): ``tide_storage_queue_locks``
(unexpired leases, sampled) and ``tide_storage_queue_lock_handovers_total{reason}``
(a queue locked by another member than its last holder: ``released`` after an unlock,
``expired`` after its holder stopped renewing).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from opentelemetry.metrics import Histogram

from services.storage.engine.commitlog import AppendBatch
from services.storage.engine.message_store import MessageStore
from services.storage.engine.queue_locks import QueueLockManager
from services.storage.replication.node import Replication
from tide.server import ByteBudget, ColdReads
from tide.server._metrics import (
    LATENCY_BUCKETS_S,
    Sample,
    SampledGauges,
    observable_total,
    service_meter,
)

# Lock waits and flushes are far shorter than calls: 1 us .. 1 s.
SHORT_BUCKETS_S: tuple[float, ...] = (
    0.000001,
    0.000005,
    0.00001,
    0.00005,
    0.0001,
    0.0005,
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
)


class StorageMetrics:
    def __init__(
        self,
        store: Callable[[], MessageStore | None],
        replication: Callable[[], Replication | None],
        append_budget: ByteBudget | None = None,
        queue_locks: QueueLockManager | None = None,
        cold_reads: ColdReads | None = None,
    ) -> None:
        meter = service_meter("storage")
        self._queue_locks = queue_locks
        self._store = store
        self._append_budget = append_budget
        self._replication = replication
        self.messages = 0  # updated on the event loop only
        self.bytes = 0
        observable_total(
            meter, "tide_storage_appended_messages_total", lambda: self.messages, "messages"
        )
        observable_total(
            meter,
            "tide_storage_appended_bytes_total",
            lambda: self.bytes,
            "commitlog bytes appended (records as stored)",
            unit="By",
        )
        observable_total(
            meter,
            "tide_storage_append_lock_wait_seconds_total",
            lambda: self._lock_stat("lock_wait_s"),
            "total wait for the commitlog append lock",
            unit="s",
        )
        observable_total(
            meter,
            "tide_storage_append_lock_acquisitions_total",
            lambda: self._lock_stat("lock_acquisitions"),
            "commitlog append lock acquisitions (one per appended batch)",
        )
        observable_total(
            meter,
            "tide_storage_unconsumed_messages_deleted_total",
            self._unconsumed_deleted,
            "messages past a consumer group's committed offset that forced retention "
            "(disk above --disk-clean-force-ratio) deleted",
        )
        observable_total(
            meter,
            "tide_storage_append_refused_total",
            lambda: append_budget.refused if append_budget else 0,
            "Appends refused RESOURCE_EXHAUSTED by max_append_in_flight_bytes",
        )
        observable_total(
            meter,
            "tide_storage_cold_reads_total",
            lambda: cold_reads.count if cold_reads else 0,
            "Reads, Tail and Replicate chunks whose bytes were not in memory, read with pread on a "
            "thread (the GIL free while the disk answers) instead of on the event loop",
        )
        observable_total(
            meter,
            "tide_storage_metadata_syncs_total",
            lambda: self._sync_stat("syncs"),
            "a slave's metadata syncs from its master that got and installed every file",
        )
        observable_total(
            meter,
            "tide_storage_metadata_sync_failures_total",
            lambda: self._sync_stat("failures"),
            "a slave's metadata syncs that failed (the reason: GetStatus "
            "replication.metadata_sync_error and the log)",
        )
        observable_total(
            meter,
            "tide_storage_queue_lock_handovers_total",
            lambda: queue_locks.handovers if queue_locks is not None else {},
            "queues locked by another consumer than their last holder, after it released "
            "them (reason=released) or its lock expired (reason=expired)",
            label="reason",
        )
        observable_total(
            meter,
            "tide_storage_idempotent_duplicates_total",
            self._idempotent_duplicates,
            "idempotent producers' batches answered with their original result (a retry "
            "of a stored batch: nothing written again)",
        )
        self._latency = meter.create_histogram(
            "tide_storage_append_latency_seconds",
            unit="s",
            description="Append call latency, including the flush and replica waits",
            explicit_bucket_boundaries_advisory=list(LATENCY_BUCKETS_S),
        )
        self.flush_latency: Histogram = meter.create_histogram(
            "tide_storage_flush_latency_seconds",
            unit="s",
            description="one flush pass of the commitlog (msync/fsync of the dirty segments)",
            explicit_bucket_boundaries_advisory=list(SHORT_BUCKETS_S),
        )
        self.fsyncs = meter.create_counter(
            "tide_storage_fsyncs_total", unit="1", description="segment flushes that synced data"
        )
        self.gauges = SampledGauges(meter, self.sample)
        for name, description, unit in (
            ("tide_storage_commitlog_min_offset_bytes", "commitlog min offset", "By"),
            ("tide_storage_commitlog_max_offset_bytes", "commitlog max (write) offset", "By"),
            ("tide_storage_commitlog_flushed_offset_bytes", "commitlog flushed offset", "By"),
            ("tide_storage_commitlog_committed_offset_bytes", "commitlog committed offset", "By"),
            ("tide_storage_unflushed_bytes", "bytes written but not yet flushed", "By"),
            ("tide_storage_segments", "commitlog segment files", "1"),
            ("tide_storage_disk_usage_ratio", "used fraction of the commitlog's disk", "1"),
            ("tide_storage_writable", "1 when appends are accepted, 0 when refused", "1"),
            ("tide_storage_topics", "topics in the topic table", "1"),
            (
                "tide_storage_replication_lag_bytes",
                "replication lag (slave: behind its master; master: per connected slave)",
                "By",
            ),
            ("tide_storage_replication_lag_seconds", "replication lag in time", "s"),
            ("tide_storage_replication_slaves", "a master's connected slaves", "1"),
            ("tide_storage_append_in_flight_bytes", "bytes of the Appends handled now", "By"),
            (
                "tide_storage_append_in_flight_peak_bytes",
                "the most bytes of Appends handled at once since start",
                "By",
            ),
            ("tide_storage_queue_locks", "unexpired queue locks of orderly consumers", "1"),
            (
                "tide_storage_idempotent_producers",
                "idempotent producer ids in the duplicate window (not yet expired)",
                "1",
            ),
        ):
            self.gauges.gauge(name, description, unit)

    def appended(self, count: int, batch: AppendBatch, started: float) -> None:
        """One Append call answered (``started``: its ``time.perf_counter()``)."""
        self._latency.record(time.perf_counter() - started)
        self.messages += count
        self.bytes += sum(batch.sizes)

    def _lock_stat(self, name: str) -> float:
        store = self._store()
        return 0 if store is None else float(getattr(store.commitlog, name))

    def _sync_stat(self, name: str) -> int:
        replication = self._replication()
        sync = replication.metadata_sync if replication is not None else None
        return 0 if sync is None else int(getattr(sync, name))

    def _unconsumed_deleted(self) -> int:
        store = self._store()
        return 0 if store is None else store.retention.unconsumed_deleted

    def _idempotent_duplicates(self) -> int:
        store = self._store()
        return 0 if store is None else store.idempotent_duplicates

    def flushed(self, seconds: float, synced: int) -> None:
        """One flush pass that synced ``synced`` segments (from the flush thread)."""
        self.flush_latency.record(seconds)
        self.fsyncs.add(synced)

    def sample(self) -> Sample:
        store = self._store()
        if store is None:
            return {}
        status = store.status()
        values: dict[str, object] = {
            "tide_storage_commitlog_min_offset_bytes": status.min_offset,
            "tide_storage_commitlog_max_offset_bytes": status.max_offset,
            "tide_storage_commitlog_flushed_offset_bytes": status.flushed_offset,
            "tide_storage_commitlog_committed_offset_bytes": status.committed_offset,
            "tide_storage_unflushed_bytes": max(0, status.max_offset - status.flushed_offset),
            "tide_storage_segments": status.segment_count,
            "tide_storage_disk_usage_ratio": status.disk_usage_ratio,
            "tide_storage_writable": int(status.writable),
            "tide_storage_topics": status.topic_count,
            "tide_storage_idempotent_producers": store.producers.producer_count,
        }
        if self._queue_locks is not None:
            values["tide_storage_queue_locks"] = self._queue_locks.held()
        budget = self._append_budget
        if budget is not None:
            values["tide_storage_append_in_flight_bytes"] = budget.in_use_bytes
            values["tide_storage_append_in_flight_peak_bytes"] = budget.peak_bytes
        replication = self._replication()
        if replication is not None:
            rep = replication.status()
            if rep.role == "SLAVE":
                role = {"role": "slave", "master": rep.master_address}
                values["tide_storage_replication_lag_bytes"] = [(rep.lag_bytes, role)]
                values["tide_storage_replication_lag_seconds"] = [(rep.lag_seconds, role)]
            else:
                values["tide_storage_replication_slaves"] = len(rep.slaves)
                values["tide_storage_replication_lag_bytes"] = [
                    (slave.lag_bytes, {"role": "master", "slave_id": slave.broker_id})
                    for slave in rep.slaves
                ]
                values["tide_storage_replication_lag_seconds"] = [
                    (slave.lag_seconds, {"role": "master", "slave_id": slave.broker_id})
                    for slave in rep.slaves
                ]
        return values  # type: ignore[return-value]

"""Storage engine settings. Units are last in every name; defaults are RocketMQ's."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from tide.mapped import PAGE_BYTES

GIB = 1 << 30
MIB = 1 << 20


class FlushMode(enum.Enum):
    SYNC = "sync"  # group commit: an append is answered once flushed past its record
    ASYNC = "async"  # a flush thread on an interval


@dataclass(frozen=True)
class StoreConfig:
    store_dir: Path
    segment_size_bytes: int = GIB
    flush_mode: FlushMode = FlushMode.ASYNC
    # Async flush: every interval, when at least this many dirty pages; all of them every
    # `flush_thorough_interval_ms`.
    flush_interval_ms: int = 500
    flush_least_pages: int = 4
    flush_thorough_interval_ms: int = 10_000
    sync_flush_timeout_ms: int = 5_000
    # Write buffer pool (RocketMQ's TransientStorePool): appends go to pooled memory and a
    # commit thread moves them into the file.
    write_buffer_pool_enabled: bool = False
    write_buffer_pool_buffers: int = 5
    commit_interval_ms: int = 200
    commit_least_pages: int = 4
    commit_thorough_interval_ms: int = 200
    # Segment preparation off the append path.
    preallocate_enabled: bool = True
    warm_segments_enabled: bool = True
    allocation_timeout_ms: int = 5_000
    # Message limits.
    max_message_body_bytes: int = 4 * MIB
    max_batch_messages: int = 10_000
    max_batch_bytes: int = 64 * MIB
    auto_create_topics: bool = True
    default_queue_nums: int = 4
    # Where this store says it lives (in message ids and the store_host field).
    store_host: str = "127.0.0.1:10911"
    # Retention.
    retention_hours: float = 72.0
    cleanup_hour: int = 4
    cleanup_interval_ms: int = 10_000
    disk_clean_ratio: float = 0.75
    disk_clean_force_ratio: float = 0.85
    disk_refuse_writes_ratio: float = 0.90
    delete_segments_per_pass: int = 10
    held_segment_force_delete_ms: int = 120_000
    # Snapshot of the queue offset table with the checkpoint.
    checkpoint_interval_ms: int = 1_000
    consumer_offsets_persist_interval_ms: int = 5_000
    # Idempotent producers (producer_state.py): batches kept per producer and queue, the
    # idle time after which a producer id is forgotten, how many ids at most, and how
    # often the window is snapshotted (recovery replays the records after it).
    producer_window_batches: int = 5
    producer_id_expiry_ms: int = 24 * 3_600_000
    max_idempotent_producers: int = 10_000
    producer_state_snapshot_interval_ms: int = 10_000

    def __post_init__(self) -> None:
        if self.segment_size_bytes < 64 * 1024 or self.segment_size_bytes % PAGE_BYTES:
            raise ValueError(
                f"segment_size_bytes {self.segment_size_bytes} must be a multiple of "
                f"{PAGE_BYTES} and at least 65536"
            )
        if self.max_message_body_bytes + 1024 * 64 > self.segment_size_bytes:
            raise ValueError(
                f"max_message_body_bytes {self.max_message_body_bytes} does not fit in a "
                f"segment of {self.segment_size_bytes} bytes with room for headers"
            )
        ratios = (self.disk_clean_ratio, self.disk_clean_force_ratio, self.disk_refuse_writes_ratio)
        if not 0 < ratios[0] <= ratios[1] <= ratios[2] <= 1:
            raise ValueError(
                f"disk ratios must satisfy 0 < clean <= force <= refuse <= 1: {ratios}"
            )
        self._check_producer_bounds()
        if not 0 <= self.cleanup_hour <= 23:
            raise ValueError(f"cleanup_hour {self.cleanup_hour} must be in 0..23")

    def _check_producer_bounds(self) -> None:
        bounds = (
            ("producer_window_batches", self.producer_window_batches, 1, 1_000),
            ("producer_id_expiry_ms", self.producer_id_expiry_ms, 1_000, 30 * 86_400_000),
            ("max_idempotent_producers", self.max_idempotent_producers, 1, 1_000_000),
            (
                "producer_state_snapshot_interval_ms",
                self.producer_state_snapshot_interval_ms,
                100,
                3_600_000,
            ),
        )
        for name, value, low, high in bounds:
            if not low <= value <= high:
                raise ValueError(f"{name} {value} must be in {low}..{high}")

    @property
    def commitlog_dir(self) -> Path:
        return self.store_dir / "commitlog"

    @property
    def config_dir(self) -> Path:
        return self.store_dir / "config"

"""ASYNC_FLUSH: RocketMQ's FlushRealTimeService.

Every ``flush_interval_ms`` it syncs the commitlog when at least ``flush_least_pages``
pages are dirty, and everything every ``flush_thorough_interval_ms``. The sync is an
``fdatasync`` that releases the GIL, so appends go on meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable

from services.storage.engine.segment_queue import SegmentQueue
from tide.service_thread import PagePolicy, ServiceThread

FINAL_FLUSH_ATTEMPTS = 10


class AsyncFlushService(ServiceThread):
    name = "storage.flush"

    def __init__(
        self,
        segments: SegmentQueue,
        *,
        interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
        last_store_timestamp_ms: Callable[[], int],
        on_flushed: Callable[[int], None],
    ) -> None:
        super().__init__(interval_ms / 1000)
        self._segments = segments
        self._pages = PagePolicy(least_pages, thorough_interval_ms)
        self._last_store_timestamp_ms = last_store_timestamp_ms
        self._on_flushed = on_flushed
        self.flush_count = 0

    def run_once(self) -> None:
        self.flush(self._pages.least_pages_now())

    def flush(self, least_pages: int) -> None:
        timestamp = self._last_store_timestamp_ms()
        if self._segments.flush(least_pages):
            self.flush_count += 1
            self._on_flushed(timestamp)

    def on_stop(self) -> None:
        for attempt in range(1, FINAL_FLUSH_ATTEMPTS + 1):
            try:
                self.flush(0)
                return
            except OSError:
                self.log.exception("final flush attempt %d failed", attempt)

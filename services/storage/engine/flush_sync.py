"""SYNC_FLUSH as group commit: RocketMQ's GroupCommitService.

An appender asks for its records to be durable with :meth:`GroupCommitService.request`
and waits on the returned future. The thread takes every request waiting at that moment,
syncs once (covering all of them, since they were appended before they asked), and
completes them together: one ``fdatasync`` serves every waiter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from services.storage.engine.errors import StoreError
from services.storage.engine.segment_queue import SegmentQueue
from tide.service_thread import ServiceThread

MAX_WAITING_REQUESTS = 100_000


class GroupCommitService(ServiceThread):
    name = "storage.group-commit"

    def __init__(
        self,
        segments: SegmentQueue,
        *,
        commit_first: bool,
        last_store_timestamp_ms: Callable[[], int],
        on_flushed: Callable[[int], None],
    ) -> None:
        # Woken by every request; the interval only bounds an idle wait.
        super().__init__(interval_s=0.01)
        self._segments = segments
        self._commit_first = commit_first
        self._last_store_timestamp_ms = last_store_timestamp_ms
        self._on_flushed = on_flushed
        self._lock = threading.Lock()
        self._requests: list[tuple[int, Future[None]]] = []
        self.flush_count = 0

    def request(self, end_offset: int) -> Future[None]:
        """A future that completes once the commitlog is flushed up to ``end_offset``."""
        future: Future[None] = Future()
        with self._lock:
            if len(self._requests) >= MAX_WAITING_REQUESTS:
                raise StoreError(f"more than {MAX_WAITING_REQUESTS} appends wait for a flush")
            self._requests.append((end_offset, future))
        self.wakeup()
        return future

    def run_once(self) -> None:
        with self._lock:
            batch, self._requests = self._requests, []
        if not batch:
            return
        try:
            self._sync()
        except OSError as exc:
            for _, future in batch:
                future.set_exception(exc)
            raise
        flushed = self._segments.flushed_offset
        late = []
        for end_offset, future in batch:
            if end_offset <= flushed:
                future.set_result(None)
            else:
                late.append((end_offset, future))
        if late:  # appended by a writer that has not published yet: next round
            with self._lock:
                self._requests[:0] = late
            self.wakeup()

    def _sync(self) -> None:
        timestamp = self._last_store_timestamp_ms()
        if self._commit_first:
            self._segments.commit(0)
        if self._segments.flush(0):
            self.flush_count += 1
            self._on_flushed(timestamp)

    def on_stop(self) -> None:
        self.run_once()
        with self._lock:
            batch, self._requests = self._requests, []
        for _, future in batch:
            future.set_exception(StoreError("store closed before the flush completed"))

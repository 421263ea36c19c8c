"""SegmentAllocator: creates segment N+1 in the background while N is being written.

RocketMQ's AllocateMappedFileService. Asking for segment N returns it (waiting for the
background creation if it is in flight) and schedules N+1, so in steady state an append
that rolls to a new segment finds it ready. At most ``MAX_PENDING`` creations are queued.
A creation that fails (a full disk: SegmentSpaceError) is forgotten: the append that
needs the segment creates it itself, and the retention pass schedules it again.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from services.storage.engine.segment_files import SegmentSpaceError, create_segment
from tide.mapped import MappedFile

log = logging.getLogger("tide.storage.allocator")
MAX_PENDING = 2

CreateFn = Callable[[int], MappedFile]


class SegmentAllocator:
    def __init__(
        self,
        directory: Path,
        size_bytes: int,
        *,
        preallocate: bool,
        warm: bool,
        timeout_ms: int,
    ) -> None:
        self._directory = directory
        self._size_bytes = size_bytes
        self._preallocate = preallocate
        self._warm = warm
        self._timeout_s = timeout_ms / 1000
        self._requests: queue.Queue[tuple[int, Future[MappedFile]] | None] = queue.Queue(
            maxsize=MAX_PENDING
        )
        self._pending: dict[int, Future[MappedFile]] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tide-allocator", daemon=True)
        self._stopped = False
        self._space_failures = 0  # creations ahead of need failed for space, in a row

    def start(self) -> None:
        self._thread.start()

    def _create(self, start_offset: int) -> MappedFile:
        return create_segment(
            self._directory,
            start_offset,
            self._size_bytes,
            preallocate=self._preallocate,
            warm=self._warm,
        )

    def get(self, start_offset: int) -> MappedFile:
        """Segment starting at ``start_offset``; also schedules the next one."""
        with self._lock:
            future = self._pending.pop(start_offset, None)
        segment: MappedFile | None = None
        if future is not None:
            try:
                segment = future.result(timeout=self._timeout_s)
            except FutureTimeout:
                log.warning("segment %d not ready after %.1f s", start_offset, self._timeout_s)
                raise
        if segment is None:
            segment = self._create(start_offset)
        self._schedule(start_offset + self._size_bytes)
        return segment

    def is_prepared(self, start_offset: int) -> bool:
        """The segment at ``start_offset`` is being or was created ahead of need (a failed
        creation is forgotten at once): its space is taken, or being taken."""
        with self._lock:
            future = self._pending.get(start_offset)
        return future is not None and not (future.done() and future.exception() is not None)

    def prepare(self, start_offset: int) -> None:
        """Create the segment at ``start_offset`` ahead of need (at open, so the first
        roll after a restart finds it ready)."""
        self._schedule(start_offset)

    def _schedule(self, start_offset: int) -> None:
        with self._lock:
            if self._stopped or start_offset in self._pending or not self._thread.is_alive():
                return
            future: Future[MappedFile] = Future()
            try:
                self._requests.put_nowait((start_offset, future))
            except queue.Full:
                log.warning(
                    "allocation queue full; segment %d will be created on demand", start_offset
                )
                return
            self._pending[start_offset] = future

    def _run(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            start_offset, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                segment = self._create(start_offset)
            except BaseException as exc:
                self._failed(start_offset, future, exc)
            else:
                self._space_failures = 0
                future.set_result(segment)

    def _failed(self, start_offset: int, future: Future[MappedFile], exc: BaseException) -> None:
        """A creation ahead of need failed: forget it, so that ``get`` creates the segment
        itself (and raises the error there) and a later ``prepare`` tries again."""
        with self._lock:
            if self._pending.get(start_offset) is future:
                del self._pending[start_offset]
        if isinstance(exc, SegmentSpaceError):
            self._space_failures += 1
            if self._space_failures == 1:  # once per full-disk episode, not per retry
                log.warning("segment %d cannot be created ahead of need: %s", start_offset, exc)
        else:
            log.error("creating segment %d failed", start_offset, exc_info=exc)
        future.set_exception(exc)

    def stop(self) -> None:
        """Stop the thread; delete segments created ahead but never handed out."""
        with self._lock:
            self._stopped = True
            leftovers = list(self._pending.values())
            self._pending.clear()
        if self._thread.is_alive():
            self._requests.put(None)
            self._thread.join(timeout=30)
        for future in leftovers:
            if future.done() and future.exception() is None:
                future.result().close(unlink=True)

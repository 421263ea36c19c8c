"""ConsumeQueueStore: every consume queue under ``<root>/consumequeue`` (RocketMQ's
consumeQueueTable with loadConsumeQueue, recoverConsumeQueue, truncateDirtyLogicFiles and
the CleanConsumeQueueService pass).

Threads: one writer thread (the dispatcher) calls get_or_create, put (on a queue),
truncate_past, delete_below and close; flush may run on a flush thread. Readers (find,
topics, counts and the queues' read methods, see consume_queue.py) may run on the gRPC
loop meanwhile: find is a plain dict lookup, the table is changed and iterated under a
lock, and each queue's readers only read published positions.

Flush policy (the caller's; RocketMQ's flushIntervalConsumeQueue): every
FLUSH_INTERVAL_MS with FLUSH_LEAST_PAGES, everything (0 pages) every
FLUSH_THOROUGH_INTERVAL_MS.

Each segment holds a file descriptor and a mapping: a store with many queues needs
RLIMIT_NOFILE and vm.max_map_count (65,530 by default) raised accordingly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from services.dispatch.engine.consume_queue import (
    MAX_QUEUE_ID,
    ConsumeQueue,
    ConsumeQueueError,
)
from tide.format import DEFAULT_ENTRIES_PER_SEGMENT
from tide.naming import topic_error

log = logging.getLogger("tide.dispatch.consume_queue_store")

MAX_QUEUES = 1_000_000
FLUSH_INTERVAL_MS = 1_000
FLUSH_LEAST_PAGES = 2
FLUSH_THOROUGH_INTERVAL_MS = 60_000


class ConsumeQueueLimitError(ConsumeQueueError):
    """The store already holds its maximum number of queues."""


class StoreCounts(NamedTuple):
    queues: int
    segments: int


def parse_queue_id(name: str) -> int | None:
    """The queue id a directory name stands for (canonical decimal), or None."""
    if not name.isascii() or not name.isdigit() or name != str(int(name)):
        return None
    queue_id = int(name)
    return queue_id if queue_id <= MAX_QUEUE_ID else None


class ConsumeQueueStore:
    def __init__(
        self,
        root: Path,
        entries_per_segment: int = DEFAULT_ENTRIES_PER_SEGMENT,
        *,
        max_queues: int = MAX_QUEUES,
    ) -> None:
        if not 1 <= max_queues <= MAX_QUEUES:
            raise ValueError(f"max queues {max_queues} is outside 1..{MAX_QUEUES}")
        self.root = root
        self.directory = root / "consumequeue"
        self.entries_per_segment = entries_per_segment
        self.max_queues = max_queues
        self._queues: dict[str, dict[int, ConsumeQueue]] = {}
        self._count = 0
        self._lock = threading.Lock()  # changes to the table, and iterating it
        self._closed = False

    # -- loading and recovery --------------------------------------------------------
    def load(self) -> None:
        """Map every queue found on disk; junk directory names are skipped with a
        warning, a broken queue raises (after unmapping what was loaded)."""
        if not self.directory.is_dir():
            return
        try:
            for topic_dir in sorted(self.directory.iterdir()):
                error = topic_error(topic_dir.name)
                if error or not topic_dir.is_dir():
                    log.warning("ignoring %s: %s", topic_dir, error or "not a directory")
                    continue
                for queue_dir in sorted(topic_dir.iterdir()):
                    self._load_queue(topic_dir.name, queue_dir)
        except BaseException:
            self.close()
            raise
        log.info("loaded %d consume queue(s) from %s", self._count, self.directory)

    def _load_queue(self, topic: str, queue_dir: Path) -> None:
        queue_id = parse_queue_id(queue_dir.name)
        if queue_id is None or not queue_dir.is_dir():
            log.warning("ignoring %s: not a queue id directory (0..%d)", queue_dir, MAX_QUEUE_ID)
            return
        queue = ConsumeQueue(self.root, topic, queue_id, self.entries_per_segment)
        with self._lock:
            self._insert(queue)  # before load(): close() unmaps it if load() fails midway
        queue.load()

    def recover(self) -> int:
        """Recover every queue; returns max_commitlog_end()."""
        for queue in self.queues():
            queue.recover()
        return self.max_commitlog_end()

    # -- the table -------------------------------------------------------------------
    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        queues = self._queues.get(topic)
        return None if queues is None else queues.get(queue_id)

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, created (recovered, ready for put) if the store has none yet."""
        queue = self.find(topic, queue_id)
        if queue is not None:
            return queue
        with self._lock:
            queue = self.find(topic, queue_id)
            if queue is None:
                queue = ConsumeQueue(self.root, topic, queue_id, self.entries_per_segment)
                self._check_room()
                try:  # its directory may hold files already (created after load())
                    queue.load()
                    queue.recover()
                except BaseException:
                    queue.close()
                    raise
                self._insert(queue)
            return queue

    def _insert(self, queue: ConsumeQueue) -> None:
        """Add ``queue`` to the table; the caller holds the lock."""
        assert self._lock.locked()
        self._check_room()
        queues = self._queues.setdefault(queue.topic, {})
        assert queue.queue_id not in queues, queue
        queues[queue.queue_id] = queue
        self._count += 1

    def _check_room(self) -> None:
        if self._closed:
            raise ConsumeQueueError("the consume queue store is closed")
        if self._count >= self.max_queues:
            raise ConsumeQueueLimitError(
                f"the store already holds {self._count} consume queues, the limit "
                f"({self.max_queues}); delete unused topics or raise the limit"
            )

    def queues(self) -> list[ConsumeQueue]:
        with self._lock:
            return [queue for queues in self._queues.values() for queue in queues.values()]

    def topics(self) -> dict[str, list[int]]:
        with self._lock:
            return {topic: sorted(queues) for topic, queues in sorted(self._queues.items())}

    def counts(self) -> StoreCounts:
        queues = self.queues()
        return StoreCounts(len(queues), sum(queue.segment_count for queue in queues))

    # -- over every queue ------------------------------------------------------------
    def max_commitlog_end(self) -> int:
        """Largest commitlog end offset any queue covers (0 for none): where dispatch
        may resume (RocketMQ's maxPhysicalPosInLogicQueue)."""
        return max((queue.max_commitlog_end for queue in self.queues()), default=0)

    def truncate_past(self, commitlog_offset: int) -> int:
        """truncate_past on every queue; returns the entries dropped."""
        return self._sum(lambda queue: queue.truncate_past(commitlog_offset))

    def delete_below(self, commitlog_min_offset: int) -> int:
        """delete_below on every queue; returns the segments deleted."""
        return self._sum(lambda queue: queue.delete_below(commitlog_min_offset))

    def flush(self, least_pages: int) -> bool:
        """flush on every queue; True if any synced."""
        return self._sum(lambda queue: int(queue.flush(least_pages))) > 0

    def _sum(self, action: Callable[[ConsumeQueue], int]) -> int:
        return sum(action(queue) for queue in self.queues())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            queues = [queue for queues in self._queues.values() for queue in queues.values()]
        for queue in queues:
            queue.close()

"""Reads of mapped files' bytes that are not in memory, done off the event loop.

A service reads its memory-mapped files on the event loop's thread. For bytes in memory
that is a copy; for bytes the kernel has to fetch from the disk it is a page fault, and a
fault holds the GIL for its whole disk read: every call, answer and stream of the process
waits behind it (docs/benchmarks.md "Reads of bytes not in memory": 400 random 64 KiB
reads through a mapping kept another thread waiting 377-445 ms of their 400-474 ms;
through ``pread`` on a thread, 0 ms of 49-53).

:class:`ColdReads` runs such a read on a small pool of threads marked to read the files
with ``pread`` (tide.mapped.read_through_file): the GIL is free while the disk answers and
the loop goes on. The service decides what is cold (``MappedFile.resident``: mincore) and
hands only that over: a read in memory stays on the loop (a hop to a thread costs more
than the copy). Used by the storage (commitlog reads, Tail and Replicate chunks:
services/storage/cold_reads.py) and the dispatch (consume-queue entries read far behind
their queue's end: services/dispatch/cold_entries.py).

Bounds: ``COLD_READ_THREADS`` threads (the disk, not the CPU, is what they wait for; a
few keep a disk's queue busy), and ``COLD_READS_IN_FLIGHT`` reads handed to them at once;
past it a read waits on the loop for a slot, as its caller's call or stream does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from tide.mapped import read_through_file

_T = TypeVar("_T")

COLD_READ_THREADS = 2
COLD_READS_IN_FLIGHT = 8


class ColdReads:
    """One service's cold readers: the threads (started by the first cold read), the slots
    bounding what is handed to them, and the counts its metrics export."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None  # started by the first cold read
        self._slots = asyncio.Semaphore(COLD_READS_IN_FLIGHT)
        self.count = 0  # reads handed to the pool (the service's cold reads metric)
        self.in_flight = 0  # of them, not done yet (on the loop's thread)

    async def run(self, read: Callable[[], _T]) -> _T:
        """``read()`` on a thread that reads the files with pread; raises what it raises.
        A read keeps its slot until its thread is done with it, even when its caller
        went away meanwhile (a cancelled call): the bound counts what the threads do."""
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        try:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    COLD_READ_THREADS,
                    thread_name_prefix="tide-cold-read",
                    initializer=read_through_file,
                )
            done = self._pool.submit(read)
        except BaseException:
            self._slots.release()
            raise
        self.count += 1
        self.in_flight += 1
        done.add_done_callback(lambda _: _call_on(loop, self._free_slot))
        return await asyncio.wrap_future(done)

    def _free_slot(self) -> None:
        self.in_flight -= 1
        self._slots.release()

    def close(self) -> None:
        """Stop the threads once the reads handed to them are done."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def _call_on(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """``callback`` on ``loop``'s thread (from a pool thread, or the loop's own when a
    read is cancelled before it ran); nothing once the loop is closed (shutdown)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)

"""Consume-queue entries that are not in memory, brought in off the event loop.

The dispatch reads consume-queue entries from their mappings on its event loop: a pull's
GetQueueEntries, a POP consumer's receive, a delay level's delivery. Entries written
moments ago are in memory; a reader far behind its queue's end (a consumer replaying a
backlog, a delay level of hours) may find them on the disk only, and a page fault holds
the GIL for the disk read: every call and stream of the dispatch waits behind it.

:func:`page_in` is what such a reader does first: COLD_CHECK_BEHIND_ENTRIES or more
behind the end, it asks whether the entries are in memory (``ConsumeQueue.resident``:
mincore) and, when they are not, has a cold reader's thread (tide.server.ColdReads, its
bounds) read them with ``pread``, which leaves them in the page cache; the loop's read
that follows takes no disk read. Nearer the end nothing is checked: a reader keeping up
never pays for it.
"""

from __future__ import annotations

from services.dispatch.engine.consume_queue import ConsumeQueue
from tide.server import ColdReads

# 4,096 entries are 80 KiB of consume queue: written moments ago for any reader this
# close to the end.
COLD_CHECK_BEHIND_ENTRIES = 4_096


async def page_in(
    cold_reads: ColdReads | None, queue: ConsumeQueue, offset: int, count: int
) -> None:
    """Have the ``count`` entries from ``offset`` in memory before they are read on the
    loop, when ``offset`` is COLD_CHECK_BEHIND_ENTRIES or more behind ``queue``'s end
    (see the module docstring). Nothing for an offset outside the queue (its read says
    so), nor without cold readers (None: a service's tests that do not give any)."""
    behind = queue.max_offset - offset
    if cold_reads is None or count < 1 or behind < COLD_CHECK_BEHIND_ENTRIES:
        return  # the common case first: a reader near the end
    if offset < queue.min_offset:
        return
    count = min(count, behind)
    if not queue.resident(offset, count):
        await cold_reads.run(lambda: queue.get_bytes(offset, count))

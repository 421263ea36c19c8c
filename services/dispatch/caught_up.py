"""Which arrival notices carry their queue's new entries (servicer.py's WatchArrivals).

A gateway keeps the entries notices carried and answers records pulls from them without
a GetQueueEntries (services/gateway/arrived_entries.py). That saves a pull a second turn
of this process's event loop, but every notice that carries entries costs this process
(spans, a copy of the records) and the gateway (keeping them), used or not. Two cases
pay off:

* **Small notices while a records reader keeps up** (its last read, no tag filter,
  ended within ``CAUGHT_UP_MAX_BEHIND_ENTRIES`` of the queue's end; for the next
  ``CAUGHT_UP_NOTICES`` notices): a consumer of single messages pulls about once per
  notice, so each carried notice saves a GetQueueEntries. Only notices of at most
  ``SMALL_NOTICE_MAX_ENTRIES`` entries and ``SMALL_NOTICE_MAX_BYTES`` of records: on a
  busy queue (batches of 100 at ~200 k msgs/s) a consumer a little behind takes many
  notices' records in one larger pull, so carrying every notice's records cost more
  than the pulls it saved (measured: docs/performance.md, "Tried, not kept").
* **Any notice starting where a records reader found nothing new** (a pull is held
  exactly there): it is woken with the entries and answers at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from tide.limits import PULL_MAX_MESSAGES

QueueKey = tuple[str, int]  # (topic, queue id)

# Queues whose reader is remembered (deleted topics' queues stay until then); forgotten
# all at once past it (their next notices carry no entries, until the next read).
MAX_CAUGHT_UP_QUEUES = 100_000
# A queue's small notices carry entries for this many notices (per watch) after a records
# reader last read it to its end or nearly. A gateway answers that consumer's pulls from
# them without reading here, so its reads stop; past this its notices go back to offsets
# only until a read reaches the end again (one GetQueueEntries a queue per this many
# notices while it keeps up), and a consumer that left costs this many.
CAUGHT_UP_NOTICES = 128
# A read that ends this many entries or fewer before the queue's end counts as caught up:
# the consumer reaches the notices' entries with its next pull or so (one pull's worth).
CAUGHT_UP_MAX_BEHIND_ENTRIES = PULL_MAX_MESSAGES
# A notice is small (carries its entries for a reader keeping up) with at most this many
# new entries and bytes of records. Single messages from a few callers in flight make
# notices of 1-4 entries of ~1 KiB (target 3); batched producers make notices of 100 or
# more entries (target 1), which stay offsets only.
SMALL_NOTICE_MAX_ENTRIES = 16
SMALL_NOTICE_MAX_BYTES = 64 << 10


@dataclass(slots=True)
class _Reader:
    waiting_at: int  # the offset where a records read found nothing new, or -1
    small_notices_left: int


class CaughtUpReaders:
    """Per queue, what its last records read (spans, records, no tag codes) says about
    the notices that follow."""

    def __init__(self) -> None:
        self._readers: dict[QueueKey, _Reader] = {}

    def __len__(self) -> int:
        return len(self._readers)

    def note_read(self, key: QueueKey, offset: int, next_offset: int, max_offset: int) -> None:
        """A records read of the queue from ``offset`` answered up to ``next_offset``
        against ``max_offset``: remember it while it reached the end or nearly, forget
        the queue once a read stops further back (a reader behind would not use
        entries)."""
        if max_offset - next_offset > CAUGHT_UP_MAX_BEHIND_ENTRIES:
            self._readers.pop(key, None)
            return
        if key not in self._readers and len(self._readers) >= MAX_CAUGHT_UP_QUEUES:
            self._readers.clear()
        waiting_at = offset if offset == max_offset else -1
        self._readers[key] = _Reader(waiting_at, CAUGHT_UP_NOTICES)

    def take_small(self, key: QueueKey, since: int, max_offset: int) -> bool:
        """Whether the notice announcing ``since``..``max_offset`` is small and its queue's
        reader keeps up; counts it against CAUGHT_UP_NOTICES when so. (The notice still
        carries nothing when its records pass SMALL_NOTICE_MAX_BYTES.)"""
        reader = self._readers.get(key)
        if reader is None or reader.small_notices_left <= 0:
            return False
        if max_offset - since > SMALL_NOTICE_MAX_ENTRIES:
            return False
        reader.small_notices_left -= 1
        return True

    def waiting_at(self, key: QueueKey, since: int) -> bool:
        """Whether a records read found nothing new at ``since`` (a pull is held there)."""
        reader = self._readers.get(key)
        return reader is not None and reader.waiting_at == since

"""GetQueueEntries' selection as record spans: the entries a pull takes, grouped into runs
of records that lie back to back in the commitlog (what Storage/Read takes as
``ReadRequest.spans``), so that a pull reads a few ranges instead of one record at a time.

This is the hot path of every pull (up to 1024 entries a call), so :func:`select_spans`
takes the consume queue's bare entry tuples (ConsumeQueue.get_units, made in C) rather
than an Entry each, and picks and groups them in one pass over plain ints: no object per
entry beyond those tuples, one tuple per span.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import NamedTuple

from services.dispatch.engine.consume_queue import Unit
from tide.format import PRE_BLANK_SIZE

# max_bytes 0 (no byte limit) as a limit no sum of record sizes reaches.
UNLIMITED_BYTES = 2**63 - 1


# A RecordSpan's (physical_offset, size, count): ``count`` whole records back to back,
# [physical_offset, physical_offset + size).
Span = tuple[int, int, int]


class Spans(NamedTuple):
    """What one call selected, and where the next call continues."""

    spans: list[Span]
    next_offset: int


def select_spans(
    units: Sequence[Unit],
    first_offset: int,
    max_count: int,
    tag_codes: Collection[int],
    max_bytes: int,
    next_offset: int,
) -> Spans:
    """The entries GetQueueEntries would return, as spans of adjacent records.

    ``units`` are the consume queue entries looked at, in queue order, as
    ``(commitlog_offset, size, tags_code)`` (ConsumeQueue.get_units); the first is at
    queue offset ``first_offset``, the others follow it. PRE_BLANK entries
    (``(0, PRE_BLANK_SIZE, 0)``) and, when ``tag_codes`` is not empty, entries whose tags
    code is not in it are skipped; at most ``max_count`` are taken; with ``max_bytes`` > 0
    the entries stop before the one that would take the records' total size past it (the
    first is always taken). An entry extends the current span when its record starts
    where the span ends (a skipped record in between ends the span). ``next_offset`` (the
    request's offset) becomes the offset past the last entry looked at, or the entry the
    byte limit stopped at.
    """
    limit = max_bytes or UNLIMITED_BYTES
    spans: list[Span] = []
    taken = total = start = size = count = 0
    end = -1  # where the current span's records end (none yet)
    for queue_offset, (offset, entry_size, code) in enumerate(units, first_offset):
        if taken >= max_count:
            break
        if (entry_size == PRE_BLANK_SIZE and offset == 0 and code == 0) or (
            tag_codes and code not in tag_codes
        ):
            next_offset = queue_offset + 1
            continue
        total += entry_size
        if total > limit and taken:
            return Spans(_closed(spans, start, size, count), queue_offset)
        next_offset = queue_offset + 1
        taken += 1
        if offset == end:
            size += entry_size
            count += 1
        else:
            if count:
                spans.append((start, size, count))
            start, size, count = offset, entry_size, 1
        end = offset + entry_size
    return Spans(_closed(spans, start, size, count), next_offset)


def _closed(spans: list[Span], start: int, size: int, count: int) -> list[Span]:
    """``spans`` with the span being built (if any) appended."""
    if count:
        spans.append((start, size, count))
    return spans

"""GetQueueEntries' selection as record spans: the consume-queue entries a pull takes,
grouped into runs of records that lie back to back in the commitlog (what Storage/Read
takes as ``ReadRequest.spans``), so that a pull reads a few ranges instead of one record
at a time.

This is the hot path of every pull (up to 1024 entries a call, 800 looked at with a tag
filter), so :func:`select_spans` reads the consume queue's raw entries (their bytes as
``ConsumeQueue.get_bytes`` returns them) in the compiled core (``_ccore.entry_spans``):
no Python object per entry, one tuple per span. Its pure-Python reference,
:func:`select_spans_python`, runs with ``TIDE_NO_EXTENSIONS=1`` and for input the
compiled one declines (tag codes that are not a set of at most 256 ints fitting in 64
bits, int arguments that do not fit); tests/format/test_ccore_entry_spans.py holds the
two equal.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TypeAlias

from tide.format import _core
from tide.format._consume_queue import ENTRY_BYTES, PRE_BLANK_SIZE, iter_entries
from tide.format._record import Buffer

# max_bytes 0 (no byte limit) as a limit no sum of record sizes reaches.
UNLIMITED_BYTES = 2**63 - 1
# Where no span's records end yet: below every int64, so no entry's offset equals it.
_NO_END = -(2**63) - 1

# A RecordSpan's (physical_offset, size, count): ``count`` whole records back to back,
# [physical_offset, physical_offset + size).
Span: TypeAlias = tuple[int, int, int]
# What one call selected, and where the next call continues: (spans, next_offset).
Spans: TypeAlias = tuple[list[Span], int]

_Compiled: TypeAlias = Callable[[Buffer, int, int, Collection[int], int, int], Spans | None]
_compiled: _Compiled | None = None if _core.ccore is None else _core.ccore.entry_spans


def select_spans(
    entries: Buffer,
    first_offset: int,
    max_count: int,
    tag_codes: Collection[int],
    max_bytes: int,
    next_offset: int,
) -> Spans:
    """The entries GetQueueEntries would return, as spans of adjacent records.

    ``entries`` are the consume queue entries looked at, in queue order, as their bytes
    (``ENTRY_BYTES`` each: ``commitlog_offset:i64 size:i32 tags_code:i64``, big-endian;
    a length that is not a multiple of it is a ValueError); the first is at queue offset
    ``first_offset``, the others follow it. PRE_BLANK entries (``(0, PRE_BLANK_SIZE,
    0)``) and, when ``tag_codes`` is not empty, entries whose tags code is not in it are
    skipped; at most ``max_count`` are taken; with ``max_bytes`` > 0 the entries stop
    before the one that would take the records' total size past it (the first is always
    taken). An entry extends the current span when its record starts where the span ends
    (a skipped record in between ends the span). ``next_offset`` (the request's offset)
    becomes the offset past the last entry looked at, or the entry the byte limit
    stopped at.
    """
    compiled = _compiled
    if compiled is not None:
        answer = compiled(entries, first_offset, max_count, tag_codes, max_bytes, next_offset)
        if answer is not None:
            return answer
    return select_spans_python(entries, first_offset, max_count, tag_codes, max_bytes, next_offset)


def select_spans_python(
    entries: Buffer,
    first_offset: int,
    max_count: int,
    tag_codes: Collection[int],
    max_bytes: int,
    next_offset: int,
) -> Spans:
    """:func:`select_spans` in Python (the reference of ``_ccore.entry_spans``): one
    pass over plain ints, the entries unpacked in C (:func:`iter_entries`)."""
    length = memoryview(entries).nbytes
    if length % ENTRY_BYTES:
        raise ValueError(
            f"consume queue entries of {length} bytes: not a multiple of {ENTRY_BYTES} (one entry)"
        )
    limit = max_bytes or UNLIMITED_BYTES
    spans: list[Span] = []
    taken = total = start = size = count = 0
    end = _NO_END  # where the current span's records end
    for queue_offset, (offset, entry_size, code) in enumerate(iter_entries(entries), first_offset):
        if taken >= max_count:
            break
        if (entry_size == PRE_BLANK_SIZE and offset == 0 and code == 0) or (
            tag_codes and code not in tag_codes
        ):
            next_offset = queue_offset + 1
            continue
        total += entry_size
        if total > limit and taken:
            return _closed(spans, start, size, count), queue_offset
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
    return _closed(spans, start, size, count), next_offset


def _closed(spans: list[Span], start: int, size: int, count: int) -> list[Span]:
    """``spans`` with the span being built (if any) appended."""
    if count:
        spans.append((start, size, count))
    return spans

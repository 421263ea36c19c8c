"""Pull answered as stored records (``PullRequest.ENCODING_RECORDS``).

The messages a pull finds travel as the commitlog holds them: the dispatch groups the
queue's entries into spans of adjacent records (``GetQueueEntriesRequest.spans``, at most
``--max-pull-bytes`` of them), the storage reads each span as one slice and checks its
records' headers (``ReadRequest.spans``), and the gateway hands the bytes on
(``PullResponse.records``) for the client to decode and check (body CRCs). The newest
records come straight from the dispatch (``GetQueueEntriesRequest.records``: it keeps what
it followed last in a tail cache), so a consumer that keeps up costs no storage read. Nobody builds
an object per message on the way, which is what made decoded pulls cost the storage and
the gateway several microseconds per message (RocketMQ's pull works the same way: the
broker sends stored messages, the client's MessageDecoder decodes them).

The only per-message work left is a tag expression's exact match: two tags can share the
hash code the dispatch filtered on, so each record's TAGS is read back here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tide.format import record_tags
from tide.v1 import storage_pb2 as storage_pb

FOUND = storage_pb.FOUND


class SpanReadMismatch(Exception):
    """The storage answered a span read with a status count that is not one per span
    (e.g. a storage that predates span reads and saw an empty positions list)."""


def found_records(
    spans: Sequence[storage_pb.RecordSpan], read: storage_pb.ReadResponse
) -> tuple[bytes, int]:
    """The records of the spans the storage found, and how many there are; spans it did
    not find (deleted by retention meanwhile) are skipped, as a decoded pull skips them."""
    statuses = read.span_statuses
    if len(statuses) != len(spans):
        raise SpanReadMismatch(
            f"the storage answered {len(statuses)} span statuses for {len(spans)} spans"
        )
    count = 0
    size = 0
    for span, status in zip(spans, statuses, strict=True):
        if status == FOUND:
            count += span.count
            size += span.size
    records = read.records
    if len(records) != size:
        raise SpanReadMismatch(
            f"the storage answered {len(records)} bytes of records for found spans of {size}"
        )
    return records, count


def cached_records(spans: Sequence[storage_pb.RecordSpan], records: bytes) -> tuple[bytes, int]:
    """The records the dispatch answered with its spans (all of them, from its tail
    cache), and how many there are."""
    size = sum(span.size for span in spans)
    if len(records) != size:
        raise SpanReadMismatch(f"the dispatch answered {len(records)} bytes for spans of {size}")
    return records, sum(span.count for span in spans)


def matching_records(
    records: bytes, count: int, matches: Callable[[str], bool]
) -> tuple[bytes, int]:
    """The records among ``count`` back-to-back ``records`` whose TAGS ``matches``."""
    view = memoryview(records)
    kept: list[memoryview] = []
    pos = 0
    sizes, tags = record_tags(records, count)
    for size, tag in zip(sizes, tags, strict=True):
        if matches(tag):
            kept.append(view[pos : pos + size])
        pos += size
    return b"".join(kept), len(kept)

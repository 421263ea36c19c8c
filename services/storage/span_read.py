"""Read's ``spans`` form: runs of whole commitlog records, returned exactly as stored.

The gateway's pulls ask for records it decodes itself: the consume queue gives it an
(offset, size) per message and the dispatch groups adjacent ones into
``RecordSpan(physical_offset, size, count)``. This path is the hot one, so it stays cheap:
one read per span and segment, then a header check per record (TOTALSIZE, MAGICCODE and
PHYSICALOFFSET) — no per-record proto objects, no decoding, and no body CRC check (the
client checks the CRCs when it decodes the records).

A record never crosses a segment end (engine/commitlog.py), so a span spans two segments
only where a record ends exactly at a segment end; a span running into a segment's blank
filler is not a run of records (the header check sees the blank marker).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import grpc

from services.storage.engine.commitlog import CommitLog, OffsetBelowMinError
from tide.format import span_records
from tide.server import ServiceError
from tide.v1 import storage_pb2 as pb

Status: TypeAlias = pb.ReadStatus.ValueType


def check_spans(spans: Sequence[pb.RecordSpan], max_records: int, max_bytes: int) -> None:
    """Raise ServiceError unless every span is well-formed and the request is within the
    limits: at most ``max_records`` spans and records in all, ``max_bytes`` bytes."""
    if len(spans) > max_records:
        raise _invalid(f"{len(spans)} spans; at most {max_records} per Read")
    for index, span in enumerate(spans):
        if span.count < 1 or span.size <= 0 or span.physical_offset < 0:
            raise _invalid(
                f"spans[{index}]: count and size must be >= 1 and physical_offset >= 0 "
                f"(got count {span.count}, size {span.size}, "
                f"physical_offset {span.physical_offset})"
            )
    records = sum(span.count for span in spans)
    if records > max_records:
        raise _invalid(f"spans hold {records} records; at most {max_records} per Read")
    total = sum(span.size for span in spans)
    if total > max_bytes:
        raise ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"Read asks for {total} bytes; at most {max_bytes} per call: split it",
        )


def read_spans(commitlog: CommitLog, spans: Sequence[pb.RecordSpan]) -> pb.ReadResponse:
    """One status per span, in order, and the bytes of the FOUND spans back to back
    (checked by :func:`check_spans` first). Body CRCs are not verified here: the client
    verifies them when it decodes the records."""
    statuses: list[Status] = []
    parts: list[bytes] = []
    for span in spans:
        statuses.append(read_span(commitlog, span, parts))
    return pb.ReadResponse(span_statuses=statuses, records=b"".join(parts))


def read_span(commitlog: CommitLog, span: pb.RecordSpan, parts: list[bytes]) -> Status:
    """The span's status; when FOUND, its bytes (one piece per segment) go to ``parts``."""
    try:
        pieces = span_bytes(commitlog, span.physical_offset, span.size)
    except OffsetBelowMinError:
        return pb.OFFSET_BELOW_MIN
    if pieces is None:
        return pb.OFFSET_ABOVE_MAX
    if not are_records(pieces, span.physical_offset, span.count):
        return pb.NOT_A_RECORD
    parts.extend(pieces)
    return pb.FOUND


def span_bytes(commitlog: CommitLog, offset: int, size: int) -> list[bytes] | None:
    """The bytes of [offset, offset + size) as read, one piece per segment, or None when
    they are not all written yet. Raises OffsetBelowMinError."""
    pieces: list[bytes] = []
    at, end = offset, offset + size
    segment_bytes = commitlog.segments.size_bytes
    while at < end:
        _, data = commitlog.read_raw(at, end - at)
        if not data:
            if at < commitlog.segments.min_offset:  # deleted while being read
                raise OffsetBelowMinError(f"offset {at} is below the min offset")
            return None
        at += len(data)
        if at < end and at % segment_bytes:  # short of its segment's end: not written yet
            return None
        pieces.append(data)
    return pieces


def are_records(pieces: Sequence[bytes], offset: int, count: int) -> bool:
    """Whether ``pieces`` (consecutive, from ``offset``) hold exactly ``count`` message
    records, each whole within its piece and stored at its position."""
    found = 0
    for piece in pieces:
        records = span_records(piece, offset, count - found)
        if records < 0:
            return False
        found += records
        offset += len(piece)
    return found == count


def _invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)

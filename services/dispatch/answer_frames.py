"""The dispatch's answers that carry records, framed by hand around the tail cache's views.

A records answer (GetQueueEntries' with spans and records, an arrival notice's entries)
is the response without its records, then the ``records`` field around views of the
tail cache's buffers. Built as protobuf messages the records are joined into ``bytes``,
copied into the response, copied again into a notice (``CopyFrom``) and once more out
of it when grpc serializes it; framed here they are copied once, into the answer
(docs/performance.md, "The dispatch's entries answer framed by hand" and "Arrival
notices framed by hand"). The bytes are those protobuf writes, so callers parse the
messages as before (tests/services/dispatch/test_answer_frames.py).
"""

from __future__ import annotations

from tide.format import varint
from tide.v1 import dispatch_pb2 as pb

Parts = list[bytes | memoryview]

# GetQueueEntriesResponse.records (field 6, length-delimited): the message's last field,
# where protobuf writes it.
_RECORDS_KEY = b"\x32"
# ArrivalNotice.entries (field 5, length-delimited): the notice's last field.
_ENTRIES_KEY = b"\x2a"


def entries_parts(response: pb.GetQueueEntriesResponse, records: list[memoryview] | None) -> Parts:
    """GetQueueEntriesResponse ``response`` with ``records`` (None: without the field)
    serialized, in parts: joined, they are the message's bytes."""
    head = response.SerializeToString()
    size = sum(map(len, records)) if records is not None else 0
    if not size:  # proto3 leaves empty bytes out
        return [head]
    assert records is not None
    return [head, _RECORDS_KEY, varint(size), *records]


def notice_frame(notice: pb.ArrivalNotice, entries: Parts | None) -> bytes:
    """ArrivalNotice ``notice`` (its ``entries`` unset) serialized with ``entries``
    (``entries_parts``; None: without the field) as its entries."""
    head = notice.SerializeToString()
    if entries is None:
        return head
    return b"".join((head, _ENTRIES_KEY, varint(sum(map(len, entries))), *entries))

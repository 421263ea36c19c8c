"""The answer to an Append of ``records``: one status and the offsets as packed columns.

``columns_response`` builds it as an ``AppendResponse`` (the unary ``Append``, which
gRPC serializes). The ``AppendStream``, whose answers the storage serializes itself
(tide.server._framed), takes ``columns_answer``: the same message's bytes. With the
compiled core they are written by hand, the three columns by ``packed_varints`` in one
C pass each: protobuf (upb) building a 380-record answer from three lists and
serializing it took ~48 us in one process, and ~12 % of the event loop's thread in a
producers-only run (docs/performance.md, "The storage's Append answer and budget").
Without it, protobuf writes them (a Python varint loop would be slower than upb).
tests/services/storage/test_append_answer.py holds the bytes equal to protobuf's.
"""

from __future__ import annotations

import functools

from services.storage.engine.commitlog import AppendBatch
from tide.format import packed_varints, varint
from tide.format._core import using_extensions
from tide.v1 import storage_pb2 as pb

# AppendResponse's keys (field number << 3 | wire type), storage.proto: status (2),
# store_timestamp_ms (4) varints; msg_id_prefix (3) and the packed columns
# physical_offsets (5), queue_offsets (6), sizes (7) length-delimited; duplicate (90)
# a varint, set only when true.
_STATUS_KEY = b"\x10"
_PREFIX_KEY = b"\x1a"
_TIMESTAMP_KEY = b"\x20"
_PHYSICAL_KEY = b"\x2a"
_QUEUE_OFFSETS_KEY = b"\x32"
_SIZES_KEY = b"\x3a"
_DUPLICATE_TRUE = varint(90 << 3) + b"\x01"


def columns_response(
    batch: AppendBatch, status: pb.AppendStatus.ValueType, prefix: str, duplicate: bool
) -> pb.AppendResponse:
    """The answer as protobuf's message."""
    response = pb.AppendResponse(
        status=status,
        msg_id_prefix=prefix,
        store_timestamp_ms=batch.store_timestamp_ms,
        physical_offsets=batch.physical_offsets,
        queue_offsets=batch.queue_offsets,
        sizes=batch.sizes,
    )
    if duplicate:
        response.duplicate = True
    return response


def columns_answer(
    batch: AppendBatch, status: pb.AppendStatus.ValueType, prefix: str, duplicate: bool
) -> bytes:
    """:func:`columns_response` serialized: by hand with the compiled core, else by
    protobuf. Fields in number order, each left out at its default, as protobuf does."""
    if not using_extensions():
        return columns_response(batch, status, prefix, duplicate).SerializeToString()
    parts: list[bytes] = []
    if status:
        parts += (_STATUS_KEY, varint(status))
    if prefix:
        parts.append(_prefix_field(prefix))
    if batch.store_timestamp_ms:  # one value packed is its varint (C, not a Python loop)
        parts += (_TIMESTAMP_KEY, packed_varints((batch.store_timestamp_ms,)))
    for key, column in (
        (_PHYSICAL_KEY, batch.physical_offsets),
        (_QUEUE_OFFSETS_KEY, batch.queue_offsets),
        (_SIZES_KEY, batch.sizes),
    ):
        if column:
            payload = packed_varints(column)
            parts += (key, packed_varints((len(payload),)), payload)
    if duplicate:
        parts.append(_DUPLICATE_TRUE)
    return b"".join(parts)


@functools.lru_cache(maxsize=4)  # a storage has one prefix (its host and port)
def _prefix_field(prefix: str) -> bytes:
    encoded = prefix.encode()
    return _PREFIX_KEY + varint(len(encoded)) + encoded

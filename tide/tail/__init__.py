"""Follow a storage service's commitlog as a stream of records (``Storage/Tail``).

* :class:`RecordAssembler` (pure): Tail chunks in, complete checked records out, as
  :class:`RecordAt` objects or column-wise as a :class:`RecordBatch`.
* :class:`TailFollower` (asyncio, in :mod:`tide.tail.follower`): ``async for batch in
  follower.records()`` (or ``follower.batches()``) over gRPC, reconnecting with backoff
  from the last complete record.

Used by the dispatch service and by slave replication. This package loads no gRPC and no
``tide.v1`` (the dispatch engine uses its records: pyproject.toml's import contracts);
the follower does.
"""

from tide.tail._assembler import DEFAULT_MAX_RECORD_BYTES, RecordAssembler
from tide.tail._backoff import Backoff
from tide.tail._batch import RecordAt, RecordBatch, gc_paused
from tide.tail._errors import (
    TailCorruptionError,
    TailError,
    TailOutOfRangeError,
    TailProtocolError,
    TailRpcError,
    TailUnavailableError,
)

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "Backoff",
    "RecordAssembler",
    "RecordAt",
    "RecordBatch",
    "TailCorruptionError",
    "TailError",
    "TailOutOfRangeError",
    "TailProtocolError",
    "TailRpcError",
    "TailUnavailableError",
    "gc_paused",
]

"""Follow a storage service's commitlog as a stream of records (``Storage/Tail``).

* :class:`RecordAssembler` (pure): Tail chunks in, complete checked records out, as
  :class:`RecordAt` objects or column-wise as a :class:`RecordBatch`.
* :class:`TailFollower` (asyncio): ``async for batch in follower.records()`` (or
  ``follower.batches()``) over gRPC, reconnecting with backoff from the last complete
  record.

Used by the dispatch service and by slave replication.
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
from tide.tail._follower import (
    CHANNEL_OPTIONS,
    MAX_CHUNK_BYTES,
    RETRYABLE_CODES,
    ChannelFactory,
    TailFollower,
    insecure_channel,
)

__all__ = [
    "CHANNEL_OPTIONS",
    "DEFAULT_MAX_RECORD_BYTES",
    "MAX_CHUNK_BYTES",
    "RETRYABLE_CODES",
    "Backoff",
    "ChannelFactory",
    "RecordAssembler",
    "RecordAt",
    "RecordBatch",
    "TailCorruptionError",
    "TailError",
    "TailFollower",
    "TailOutOfRangeError",
    "TailProtocolError",
    "TailRpcError",
    "TailUnavailableError",
    "gc_paused",
    "insecure_channel",
]

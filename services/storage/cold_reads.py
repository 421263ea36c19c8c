"""The storage's reads of commitlog bytes that are not in memory (tide.server.ColdReads:
off the event loop, on threads that read the files with ``pread``).

A Read whose bytes are not all in memory (``CommitLog.resident``: ``mincore``), and a
Tail or Replicate chunk that is not, read by a follower more than a chunk behind
(:func:`cold_chunk`: a consumer replaying old messages, a dispatch rebuilding from an old
offset, a new slave), go to the cold readers (:func:`read_chunk`); a follower at the end
is not even checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from services.storage.engine.commitlog import CommitLog
from tide.server import ColdReads

_T = TypeVar("_T")


def cold_chunk(commitlog: CommitLog, offset: int, chunk_bytes: int) -> bool:
    """Whether a follower's next chunk (at most ``chunk_bytes`` from ``offset``: a Tail, a
    slave's Replicate) is to be read on a cold reader's thread: the follower is more than
    a chunk behind (a dispatch rebuilding its store, a new slave) and the chunk's bytes
    are not in memory. A follower at the end reads what was just written: no check."""
    behind = commitlog.segments.max_offset - offset
    return behind > chunk_bytes and not commitlog.resident(offset, chunk_bytes)


async def read_chunk(
    cold_reads: ColdReads,
    commitlog: CommitLog,
    offset: int,
    chunk_bytes: int,
    read: Callable[[], _T],
) -> _T:
    """``read()`` of a follower's next chunk from ``offset``: on a cold reader's thread
    when :func:`cold_chunk` says so, else here on the loop."""
    if cold_chunk(commitlog, offset, chunk_bytes):
        return await cold_reads.run(read)
    return read()

"""The storage's reads of commitlog bytes that are not in memory (tide.server.ColdReads:
off the event loop, on threads that read the files with ``pread``).

A Read whose bytes are not all in memory (``CommitLog.resident``: ``mincore``), and a
Tail or Replicate chunk that is not, read by a follower more than a chunk behind
(:func:`cold_chunk`: a consumer replaying old messages, a dispatch rebuilding from an old
offset, a new slave), go to the cold readers; a follower at the end is not even checked.
"""

from __future__ import annotations

from services.storage.engine.commitlog import CommitLog


def cold_chunk(commitlog: CommitLog, offset: int, chunk_bytes: int) -> bool:
    """Whether a follower's next chunk (at most ``chunk_bytes`` from ``offset``: a Tail, a
    slave's Replicate) is to be read on a cold reader's thread: the follower is more than
    a chunk behind (a dispatch rebuilding its store, a new slave) and the chunk's bytes
    are not in memory. A follower at the end reads what was just written: no check."""
    behind = commitlog.segments.max_offset - offset
    return behind > chunk_bytes and not commitlog.resident(offset, chunk_bytes)

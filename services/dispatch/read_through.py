"""Records by (commitlog offset, size): tail cache hits first, one storage Read for the rest.

Every reader of records inside the dispatch (the delay levels' deliveries, the timer's
enqueue, the transaction halves, POP's messages) wants the same thing: the newest records
are in the tail cache (tail_cache.py) when its consumers keep up, so each position is
looked up there, and only the misses go to the storage, together, in one call. The
storage client splits that call into as many Reads as the storage's limits need (at most
READ_MAX_POSITIONS positions and READ_MAX_BYTES of records a Read, storage_client.py), so a
call here sends ceil(misses / READ_MAX_POSITIONS) Reads or more only when the misses'
records pass READ_MAX_BYTES; a caller's batch (bounded by its own limit) bounds the rest.

What a caller makes of a record differs (raw bytes, a StoredMessage, a timer's fields), so
it passes two functions: ``held`` turns cached bytes into its result, or answers None to
send that position to the storage after all (e.g. cached bytes that do not decode: the
storage says what is really there); ``read`` reads the misses, one result a position in
order (its errors are the caller's: raised as they are).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, cast

from services.dispatch.tail_cache import TailCache

_T = TypeVar("_T")

Position = tuple[int, int]  # (commitlog offset, size)


async def read_through(
    positions: Sequence[Position],
    cache: TailCache | None,
    held: Callable[[bytes | memoryview, Position], _T | None],
    read: Callable[[list[Position]], Awaitable[Sequence[_T]]],
) -> list[_T]:
    """One result a position, in order: ``held(bytes, position)`` for those the cache
    holds (unless it answers None), the rest from one ``read(misses)`` call (none when
    every position is a hit). ``cache`` None: everything is read."""
    found: list[_T | None] = [None] * len(positions)
    missing: list[int] = []
    for index, position in enumerate(positions):
        data = None if cache is None else cache.get(*position)
        result = None if data is None else held(data, position)
        if result is None:
            missing.append(index)
        else:
            found[index] = result
    if missing:
        read_results = await read([positions[i] for i in missing])
        if len(read_results) != len(missing):
            raise RuntimeError(
                f"read answered {len(read_results)} results for {len(missing)} positions"
            )
        for index, result in zip(missing, read_results, strict=True):
            found[index] = result
    return cast("list[_T]", found)  # every slot is filled: a hit or a read result


def as_bytes(data: bytes | memoryview, position: Position) -> bytes:
    """A ``held`` for callers that want the record's bytes (a copy: the cache's buffers
    may be evicted, and callers keep what they read)."""
    return bytes(data)

"""The messages a pop hands out, read from the dispatch's tail cache when it still holds
their records (the newest ones: a consumer that keeps up), else from the storage."""

from __future__ import annotations

from collections.abc import Sequence

from services.dispatch.engine.consume_queue import Entry
from services.dispatch.read_through import Position, read_through
from services.dispatch.storage_client import StorageClient
from services.dispatch.tail_cache import TailCache
from tide.format import (
    RecordError,
    decode_record,
)
from tide.stored import stored_message
from tide.v1 import storage_pb2 as storage_pb


async def read_messages(
    entries: Sequence[Entry], cache: TailCache | None, storage: StorageClient
) -> list[storage_pb.StoredMessage | None]:
    """Each entry's message (None: no longer stored), from the cache where it can."""
    positions = [(entry.commitlog_offset, entry.size) for entry in entries]

    async def read(misses: list[Position]) -> list[storage_pb.StoredMessage | None]:
        results = await storage.read(misses)
        return [r.message if r.status == storage_pb.FOUND else None for r in results]

    return await read_through(positions, cache, _held_message, read)


def _held_message(data: bytes | memoryview, position: Position) -> storage_pb.StoredMessage | None:
    """The cached record as a message; None (read it from the storage, which says what is
    there) when it does not decode."""
    offset, size = position
    try:
        record = decode_record(data, 0, size, expected_offset=offset)
    except RecordError:
        return None
    return stored_message(record)

"""The messages a pop hands out, read from the dispatch's tail cache when it still holds
their records (the newest ones: a consumer that keeps up), else from the storage."""

from __future__ import annotations

from collections.abc import Sequence

from services.dispatch.engine.consume_queue import Entry
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
    found: list[storage_pb.StoredMessage | None] = [None] * len(entries)
    missing: list[int] = []
    for index, entry in enumerate(entries):
        data = cache.get(entry.commitlog_offset, entry.size) if cache is not None else None
        if data is None:
            missing.append(index)
            continue
        try:
            record = decode_record(data, 0, len(data), expected_offset=entry.commitlog_offset)
        except RecordError:
            missing.append(index)  # the storage says what is there
            continue
        found[index] = stored_message(record)
    if missing:
        results = await storage.read(
            [(entries[i].commitlog_offset, entries[i].size) for i in missing]
        )
        for index, result in zip(missing, results, strict=True):
            if result.status == storage_pb.FOUND:
                found[index] = result.message
    return found

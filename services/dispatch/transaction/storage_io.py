"""The transaction service's reads and appends (services/dispatch/transaction): halves
from the dispatch's tail cache when it holds them, else from the storage; storage
failures as the ServiceError its callers answer with."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import grpc

from services.dispatch.engine.consume_queue import Entry
from services.dispatch.storage_client import AppendedRun, StorageClient
from services.dispatch.tail_cache import TailCache
from tide.format import DecodedRecord, decode_record
from tide.server import ServiceError

_T = TypeVar("_T")


async def call_storage(call: Awaitable[_T]) -> _T:
    """``call``'s answer; a storage failure as a ServiceError of its code."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise ServiceError(exc.code(), f"storage: {exc.details()}") from exc


def gone(entry: Entry) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.NOT_FOUND,
        f"the record at commitlog offset {entry.commitlog_offset} is no longer stored "
        "(retention removed it)",
    )


class HalfStore:
    def __init__(self, storage: StorageClient, tail_cache: TailCache) -> None:
        self.storage = storage
        self._tail_cache = tail_cache

    async def halves(self, entries: list[Entry]) -> list[bytes | None]:
        """Each half's record: from the tail cache when it holds it (a half just written,
        the common case: no Read), the rest in one storage Read; None: no longer stored."""
        found: list[bytes | None] = []
        missing: list[int] = []
        for index, entry in enumerate(entries):
            held = self._tail_cache.get(entry.commitlog_offset, entry.size)
            found.append(None if held is None else bytes(held))
            if held is None:
                missing.append(index)
        if missing:
            positions = [(entries[i].commitlog_offset, entries[i].size) for i in missing]
            read = await call_storage(self.storage.read_records(positions))
            for index, data in zip(missing, read, strict=True):
                found[index] = data
        return found

    async def read(self, entry: Entry) -> DecodedRecord:
        record = await call_storage(self.read_record(entry.commitlog_offset, entry.size))
        if record is None:
            raise gone(entry)
        return record

    async def append(self, run: bytes, count: int) -> AppendedRun:
        return await call_storage(self.storage.append_run(run, count))

    async def read_raw(self, physical_offset: int, size: int) -> bytes | None:
        """The record's bytes, None when the storage no longer has it. Raises AioRpcError."""
        return (await self.storage.read_records([(physical_offset, size)]))[0]

    async def read_record(self, physical_offset: int, size: int) -> DecodedRecord | None:
        data = await self.read_raw(physical_offset, size)
        if data is None:
            return None
        return decode_record(data, 0, len(data), expected_offset=physical_offset)

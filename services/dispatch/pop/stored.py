"""The messages a pop hands out, read from the dispatch's tail cache when it still holds
their records (the newest ones: a consumer that keeps up), else from the storage."""

from __future__ import annotations

from collections.abc import Sequence

from services.dispatch.engine.consume_queue import Entry
from services.dispatch.storage_client import StorageClient
from services.dispatch.tail_cache import TailCache
from tide.format import (
    KEYS,
    TAGS,
    DecodedRecord,
    RecordError,
    decode_record,
    make_msg_id,
    msg_id_prefix,
)
from tide.v1 import storage_pb2 as storage_pb


def stored_message(record: DecodedRecord) -> storage_pb.StoredMessage:
    """The record as the storage's Read shows it (its id names its own store host)."""
    props = record.properties
    keys = props.get(KEYS, "")
    return storage_pb.StoredMessage(
        topic=record.topic,
        queue_id=record.queue_id,
        body=record.body,
        tags=props.get(TAGS, ""),
        keys=keys.split(" ") if keys else [],
        properties=props,
        flag=record.flag,
        born_timestamp_ms=record.born_timestamp_ms,
        born_host=str(record.born_host),
        sys_flag=record.sys_flag,
        reconsume_times=record.reconsume_times,
        prepared_transaction_offset=record.prepared_transaction_offset,
        queue_offset=record.queue_offset,
        physical_offset=record.physical_offset,
        size=record.total_size,
        store_timestamp_ms=record.store_timestamp_ms,
        store_host=str(record.store_host),
        body_crc=record.body_crc,
        msg_id=make_msg_id(msg_id_prefix(record.store_host), record.physical_offset),
    )


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

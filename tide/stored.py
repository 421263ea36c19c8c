"""A decoded commitlog record as the wire's ``StoredMessage``: one conversion for every
service that answers with stored messages (the storage's Read, the dispatch's POP answers
from its tail cache), so a message reads the same whichever process read it."""

from __future__ import annotations

from tide.format import KEYS, TAGS, DecodedRecord, make_msg_id, msg_id_prefix
from tide.v1 import storage_pb2 as pb


def stored_message(record: DecodedRecord) -> pb.StoredMessage:
    """The record as a ``StoredMessage``; its id names the record's own store host (on a
    slave: the master that stored it), as RocketMQ's offsetMsgId does."""
    props = record.properties
    keys = props.get(KEYS, "")
    return pb.StoredMessage(
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

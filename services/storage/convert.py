"""Protobuf <-> engine types, at the service edge only."""

from __future__ import annotations

import struct
import zlib
from typing import Any

from services.storage.engine.topic_table import TopicConfig
from tide.format import (
    HEADER_V4_BYTES,
    KEYS,
    MESSAGE_MAGIC_V1,
    RECORD_HEADER_V4,
    SYSFLAG_HOSTS_V6,
    TAGS,
    DecodedRecord,
    decode_properties,
    make_msg_id,
    msg_id_prefix,
)
from tide.v1 import storage_pb2 as pb

_PORT = struct.Struct(">i")
MAX_CACHED_HOSTS = 10_000


class BadRequest(ValueError):
    """A request field that cannot be converted (INVALID_ARGUMENT)."""


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


def stored_message_fields(
    data: bytes, offset: int, hosts: dict[bytes, str]
) -> dict[str, Any] | None:
    """The ``StoredMessage`` fields (zero values left out) of the record ``data`` read at
    ``offset``, for the common record (1-byte topic length, IPv4 hosts) when it passes
    the reader's checks (size, magic, field lengths, physical offset, body CRC, UTF-8
    topic); None otherwise: the caller then takes the general decoder, which says what
    is wrong. The same values as :func:`stored_message` of ``decode_record``, without its
    intermediate objects. ``hosts`` caches packed host -> ``ip:port`` text."""
    size = len(data)
    if size < HEADER_V4_BYTES + 3:
        return None
    (
        total_size,
        magic,
        body_crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_timestamp_ms,
        born,
        store_timestamp_ms,
        store,
        reconsume_times,
        prepared_transaction_offset,
        body_len,
    ) = RECORD_HEADER_V4.unpack_from(data)
    if (
        total_size != size
        or magic != MESSAGE_MAGIC_V1
        or sys_flag & SYSFLAG_HOSTS_V6
        or physical_offset != offset
        or body_len < 0
    ):
        return None
    topic_pos = HEADER_V4_BYTES + body_len
    if topic_pos + 1 > size:
        return None
    props_len_pos = topic_pos + 1 + data[topic_pos]
    if (
        props_len_pos + 2 > size
        or props_len_pos + 2 + (data[props_len_pos] << 8 | data[props_len_pos + 1]) != size
    ):
        return None
    body = data[HEADER_V4_BYTES:topic_pos]
    if zlib.crc32(body) != body_crc:
        return None
    try:
        topic = data[topic_pos + 1 : props_len_pos].decode("utf-8")
    except UnicodeDecodeError:
        return None
    born_host = hosts.get(born) or _host_text(born, hosts)
    store_host = hosts.get(store) or _host_text(store, hosts)
    fields: dict[str, Any] = {
        "topic": topic,
        "body": body,
        "born_timestamp_ms": born_timestamp_ms,
        "born_host": born_host,
        "queue_offset": queue_offset,
        "physical_offset": physical_offset,
        "size": size,
        "store_timestamp_ms": store_timestamp_ms,
        "store_host": store_host,
        "body_crc": body_crc,
        # make_msg_id inline: the packed store host is the id's prefix (on a slave too).
        "msg_id": f"{store.hex().upper()}{physical_offset:016X}",
    }
    if props_len_pos + 2 < size:
        props = decode_properties(data[props_len_pos + 2 :])
        fields["properties"] = props
        tags = props.get(TAGS)
        if tags:
            fields["tags"] = tags
        keys = props.get(KEYS)
        if keys:
            fields["keys"] = keys.split(" ")
    if queue_id:
        fields["queue_id"] = queue_id
    if flag:
        fields["flag"] = flag
    if sys_flag:
        fields["sys_flag"] = sys_flag
    if reconsume_times:
        fields["reconsume_times"] = reconsume_times
    if prepared_transaction_offset:
        fields["prepared_transaction_offset"] = prepared_transaction_offset
    return fields


def _host_text(packed: bytes, hosts: dict[bytes, str]) -> str:
    """``ip:port`` of a packed IPv4 host (as ``str(unpack_host(packed))``), cached."""
    text = f"{packed[0]}.{packed[1]}.{packed[2]}.{packed[3]}:{_PORT.unpack_from(packed, 4)[0]}"
    if len(hosts) < MAX_CACHED_HOSTS:
        hosts[packed] = text
    return text


def topic_to_pb(cfg: TopicConfig) -> pb.TopicConfig:
    return pb.TopicConfig(
        topic_name=cfg.topic_name,
        read_queue_nums=cfg.read_queue_nums,
        write_queue_nums=cfg.write_queue_nums,
        perm=cfg.perm,
        topic_sys_flag=cfg.topic_sys_flag,
        order=cfg.order,
    )


def topic_from_pb(msg: pb.TopicConfig) -> TopicConfig:
    if msg.read_queue_nums == 0 and msg.write_queue_nums == 0:
        raise BadRequest("topic.read_queue_nums and topic.write_queue_nums must be set (>= 1)")
    return TopicConfig(
        topic_name=msg.topic_name,
        read_queue_nums=msg.read_queue_nums,
        write_queue_nums=msg.write_queue_nums,
        perm=msg.perm or 6,
        topic_sys_flag=msg.topic_sys_flag,
        order=msg.order,
    )

"""Protobuf <-> engine types, at the service edge only."""

from __future__ import annotations

from services.storage.engine.topic_table import TopicConfig
from tide.format import KEYS, TAGS, DecodedRecord, make_msg_id
from tide.v1 import storage_pb2 as pb


class BadRequest(ValueError):
    """A request field that cannot be converted (INVALID_ARGUMENT)."""


def peer_host(peer: str) -> str:
    """``ip:port`` from grpc's ``context.peer()`` (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``);
    empty for other transports (the store's own host is used then)."""
    kind, _, address = peer.partition(":")
    return address if kind in ("ipv4", "ipv6") else ""


def stored_message(record: DecodedRecord, msg_id_prefix: str) -> pb.StoredMessage:
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
        msg_id=make_msg_id(msg_id_prefix, record.physical_offset),
    )


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

"""What the gateway puts into the records it encodes: the properties and the born host.

The gateway encodes produced messages as commitlog records itself (``tide.format.
RunWriter``), so a storage only checks them and assigns offsets. The messages were
checked before (``validate.py``): the properties here are joined without checks.
"""

from __future__ import annotations

import logging

from tide.format import KEYS, SHARDING_KEY, TAGS, UNIQ_KEY, RunWriter, pack_host, parse_host, varint
from tide.server import peer_address
from tide.v1 import gateway_pb2 as pb

log = logging.getLogger("tide.gateway.records")
MAX_CACHED_PEERS = 10_000
# The born host of a producer reached over a transport without an IP address (a Unix
# socket): the loopback address, port 0.
LOCAL_BORN_HOST = "127.0.0.1:0"


def add_message(
    writer: RunWriter,
    message: pb.ProduceMessage,
    queue_id: int,
    unique_key: str,
    now_ms: int,
    group: str = "",
    more_properties: bytes = b"",
) -> None:
    """``message`` as the next record of ``writer``'s run (born now unless it says when);
    ``group``: its message group on a FIFO topic, stored as ``__SHARDINGKEY``;
    ``more_properties``: encoded properties after the message's (an idempotent
    producer's)."""
    topic = message.topic
    writer.add(
        topic,
        topic.encode("utf-8"),
        queue_id,
        message.body,
        message_properties(message, unique_key, group) + more_properties,
        message.flag,
        0,
        message.born_timestamp_ms or now_ms,
    )


def message_properties(message: pb.ProduceMessage, unique_key: str, group: str = "") -> bytes:
    """``name\\x01value\\x02`` for the user properties, then UNIQ_KEY, TAGS and KEYS
    (and ``__SHARDINGKEY`` for a message ``group`` the user properties do not carry)."""
    text = f"{UNIQ_KEY}\x01{unique_key}\x02"
    if group and SHARDING_KEY not in message.properties:
        text += f"{SHARDING_KEY}\x01{group}\x02"
    tags = message.tags
    if tags:
        text += f"{TAGS}\x01{tags}\x02"
    keys = message.keys
    if keys:
        text += f"{KEYS}\x01{' '.join(keys)}\x02"
    properties = message.properties
    if properties:
        # Names, then a lookup each: a protobuf map's items() is the slow generic view.
        text = "".join([f"{name}\x01{properties[name]}\x02" for name in properties]) + text
    return text.encode("utf-8")


# AppendRequest.records (field 2, length-delimited): its key byte.
_RECORDS_KEY = b"\x12"


def append_request(run: bytes) -> bytes:
    """``storage_pb.AppendRequest(records=[run]).SerializeToString()``, one copy of the
    run instead of two (into the message, then out of it): the field's key, the run's
    length as a varint, the run."""
    return b"".join((_RECORDS_KEY, varint(len(run)), run))


class BornHosts:
    """Packed born hosts (8 bytes IPv4, 20 bytes IPv6) by gRPC peer, cached."""

    def __init__(self) -> None:
        self._packed: dict[str, bytes] = {}

    def packed(self, peer: str) -> bytes:
        cached = self._packed.get(peer)
        if cached is not None:
            return cached
        try:
            packed = pack_host(parse_host(peer_address(peer) or LOCAL_BORN_HOST))
        except ValueError as exc:  # not an address grpc gives: do not fail the produce
            log.warning("peer %r: %s; its born host is stored as %s", peer, exc, LOCAL_BORN_HOST)
            packed = pack_host(parse_host(LOCAL_BORN_HOST))
        if len(self._packed) < MAX_CACHED_PEERS:
            self._packed[peer] = packed
        return packed

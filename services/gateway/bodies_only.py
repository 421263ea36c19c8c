"""Is every message of a produce request only a topic and a body? Told from sizes.

A proto3 field at its default value is not encoded, and every other field of a
``ProduceMessage`` adds bytes once set. So when a request's encoded size is exactly what
its messages' topic and bodies alone take, no message has anything else: no tags, keys,
properties, route, flag, born time or unique key (and no unknown field). That costs one
C call for the request and one length per message, where reading the optional fields
costs eight attribute reads a message (about 2 us each message of the common request of
a high-throughput producer; validate.py falls back to them when the sizes differ).

Wire sizes (the protobuf encoding): a length-delimited field is a one-byte key (field
numbers below 16), the length as a varint, then the bytes; a request is its messages,
each a length-delimited field 1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tide.v1 import gateway_pb2 as pb

_KEY_BYTES = 1  # field numbers 1 (topic, messages), 2 (body) and 6 (sharding_key)
# ProduceRequest.compact_results set: its key and a one-byte varint.
_COMPACT_FLAG_BYTES = 2


def varint_bytes(value: int) -> int:
    """The encoded size of a non-negative varint."""
    assert value >= 0, value
    return max(1, (value.bit_length() + 6) // 7)


def field_bytes(length: int) -> int:
    """The encoded size of a length-delimited field of ``length`` bytes."""
    return _KEY_BYTES + varint_bytes(length) + length


def only_topic_and_bodies(
    messages: Sequence[pb.ProduceMessage],
    topic: str,
    request_bytes: int,
    max_body_bytes: int,
    same_fields_bytes: int = 0,
) -> bool:
    """True when every message has ``topic`` (the caller knows they share it), a body of
    1..``max_body_bytes`` bytes and nothing else, ``request_bytes`` being the encoded size
    of the request holding just ``messages``. False says nothing more: check each field.
    ``same_fields_bytes``: the encoded size of other fields every message is known to
    carry alike (the idempotent path's one queue), counted in each message."""
    assert messages, "a produce request has messages"
    lengths = Counter([len(message.body) for message in messages])
    if min(lengths) < 1 or max(lengths) > max_body_bytes:
        return False
    fixed_bytes = field_bytes(len(topic.encode())) + same_fields_bytes
    expected = 0
    for body_bytes, count in lengths.items():
        expected += count * field_bytes(fixed_bytes + field_bytes(body_bytes))
    # Each message's size is at least its topic and body fields; the request's size grows
    # with every message's, so equal totals mean every message is exactly those two.
    return expected == request_bytes


def only_topic_bodies_and_keys(
    messages: Sequence[pb.ProduceMessage], topic: str, request_bytes: int, max_body_bytes: int
) -> bool:
    """:func:`only_topic_and_bodies` for messages that each have a sharding key besides
    (FIFO produce): True when every message has one and nothing else is set."""
    topic_bytes = field_bytes(len(topic.encode()))
    expected = 0
    for message in messages:
        body_bytes = len(message.body)
        # Every message at least its three fields, or a missing key could hide another
        # field of the same size in the total.
        if not 1 <= body_bytes <= max_body_bytes or not message.HasField("sharding_key"):
            return False
        key_bytes = field_bytes(len(message.sharding_key.encode()))
        expected += field_bytes(topic_bytes + field_bytes(body_bytes) + key_bytes)
    return expected == request_bytes


def messages_bytes(request: pb.ProduceRequest, request_bytes: int) -> int:
    """The encoded size of the request's messages: its encoded size ``request_bytes``
    (taken once per request: ByteSize encodes the whole request) less its
    compact_results flag."""
    return request_bytes - (_COMPACT_FLAG_BYTES if request.compact_results else 0)

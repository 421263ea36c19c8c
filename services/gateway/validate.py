"""Request checks shared by the gateway's calls; each failure is INVALID_ARGUMENT naming
the field and saying what a valid value looks like."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import grpc

from services.gateway.bodies_only import only_topic_and_bodies, only_topic_bodies_and_keys
from services.gateway.scheduled import is_delayed, static_delay_error
from tide.format import (
    KEYS,
    SCHEDULE_BOOKKEEPING,
    SHARDING_KEY,
    TAGS,
    TRANSACTION_ID,
    UNIQ_KEY,
    property_error,
)
from tide.limits import (
    NAME_MAX_CHARS,
    PRODUCE_MAX_BYTES,
    PROPERTIES_MAX_BYTES,
    SHARDING_KEY_MAX_CHARS,
    UNIQUE_KEY_MAX_CHARS,
    limit_text,
    message_error,
    quote,
)
from tide.naming import consumer_group_error, tag_error, topic_error
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb

MAX_QUEUE_ID = 2**31 - 1
_RESERVED = {TAGS: "tags", KEYS: "keys", UNIQ_KEY: "unique_key"}


def invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def check_produce_size(size_bytes: int) -> None:
    """A Produce (or ProduceStream request) of ``size_bytes`` serialized: refused past
    PRODUCE_MAX_BYTES before anything else (the records it becomes are sized for it)."""
    if size_bytes > PRODUCE_MAX_BYTES:
        raise invalid(
            f"the request is {size_bytes} bytes; the limit is {limit_text('PRODUCE_MAX_BYTES')}: "
            "send fewer or smaller messages per request"
        )


def check_topic(topic: str, field: str = "topic") -> None:
    error = topic_error(topic)
    if error:
        raise invalid(f"{field}: {error}")


def check_group(group: str, field: str = "consumer_group") -> None:
    error = consumer_group_error(group)
    if error:
        raise invalid(f"{field}: {error}")


def check_broker_name(name: str, field: str = "broker_name") -> None:
    if not name:
        raise invalid(f"{field} is empty; name the broker (see GetTopicRoute)")
    if len(name) > NAME_MAX_CHARS:
        raise invalid(
            f"{field} is {len(name)} characters; the limit is {limit_text('NAME_MAX_CHARS')}"
        )


def check_queue_id(queue_id: int, field: str = "queue_id") -> None:
    if not 0 <= queue_id <= MAX_QUEUE_ID:
        raise invalid(f"{field} must be >= 0 (got {queue_id})")


def check_queue(topic: str, broker_name: str, queue_id: int) -> None:
    check_topic(topic)
    check_broker_name(broker_name)
    check_queue_id(queue_id)


class ProduceCheck(NamedTuple):
    topics: set[str]
    # Some message names a route (an explicit queue or a sharding key).
    routed: bool
    # Every message is only a topic and a body (no tags, keys, properties, unique key,
    # flag, born time or route): records of a fixed shape.
    bodies_only: bool
    # Some message has delay_level, deliver_at_ms or delay_ms (scheduled.py).
    delayed: bool = False
    # Some message has properties or a delay field: its type may be other than NORMAL
    # (message_types.py).
    typed: bool = True
    # Some message is transactional (a half message: transactions.py).
    transactional: bool = False
    # Every message is only a topic, a body and a sharding key (FIFO produce).
    keyed_bodies: bool = False


def check_produce_messages(
    messages: Sequence[pb.ProduceMessage], max_body_bytes: int, request_bytes: int | None = None
) -> ProduceCheck:
    """:func:`check_produce_message` for each message, with the same first error, but
    cheap for the common message (a valid topic, a body, none of the optional fields):
    each topic is checked once, and only a message with more is checked field by field.
    With ``request_bytes`` (the encoded size of the request of just ``messages``), a
    request of one topic whose messages are all bare is told by its size (bodies_only.py)."""
    topics = {message.topic for message in messages}
    if any(topic_error(topic) for topic in topics):
        for index, message in enumerate(messages):  # names the first bad message
            check_produce_message(index, message, max_body_bytes)
        raise AssertionError("a topic failed its check but no message did")
    if request_bytes is not None and len(topics) == 1:
        (topic,) = topics
        if only_topic_and_bodies(messages, topic, request_bytes, max_body_bytes):
            return ProduceCheck(topics, routed=False, bodies_only=True, typed=False)
        if only_topic_bodies_and_keys(
            messages, topic, request_bytes, max_body_bytes
        ) and _sharding_keys_fine(messages):
            return ProduceCheck(
                topics, routed=True, bodies_only=False, typed=False, keyed_bodies=True
            )
    routed = delayed = transactional = False
    bodies_only = True
    typed = False
    for index, message in enumerate(messages):
        route = message.WhichOneof("route")
        if (
            route is not None
            or not 0 < len(message.body) <= max_body_bytes
            or message.tags
            or message.keys
            or message.properties
            or message.unique_key
            or message.born_timestamp_ms < 0
            # Read last, so a message with any of the above pays nothing more here.
            or message.delay_level
            or message.deliver_at_ms
            or message.delay_ms
            or message.transactional
            or message.producer_group
            or message.transaction_id
        ):
            check_produce_message(index, message, max_body_bytes)
            # A half message takes the general path (its own topic and queue: produce.py).
            routed = routed or route is not None or message.transactional
            if message.transactional:
                transactional = typed = True
            if is_delayed(message):
                delayed = typed = True
            elif message.properties:
                typed = True
            bodies_only = False
        elif bodies_only and (message.flag or message.born_timestamp_ms):
            bodies_only = False
    return ProduceCheck(topics, routed, bodies_only, delayed, typed, transactional)


def _sharding_keys_fine(messages: Sequence[pb.ProduceMessage]) -> bool:
    """Every sharding key within its bound and storable as a property, the only checks
    a message of a topic, a body and a key needs beyond its topic's (False: the
    field-by-field check names the first bad one). A key repeated back to back is
    checked once."""
    previous = None
    for message in messages:
        key = message.sharding_key
        if key == previous:
            continue
        previous = key
        if len(key) > SHARDING_KEY_MAX_CHARS or property_error(SHARDING_KEY, key):
            return False
    return True


def check_produce_message(index: int, message: pb.ProduceMessage, max_body_bytes: int) -> None:
    where = f"messages[{index}]"
    error = message_error(message, f"{where}.")  # every field's bound first (tide.limits)
    if error:
        raise invalid(error)
    check_topic(message.topic, f"{where}.topic")
    size = len(message.body)
    if size == 0:
        raise invalid(f"{where}.body is empty; a message needs a body")
    if size > max_body_bytes:
        raise invalid(
            f"{where}.body is {size} bytes; the limit is {max_body_bytes} "
            "(--max-message-body-bytes): send smaller messages"
        )
    total = _check_tags(where, message.tags) + _check_keys(where, message.keys)
    for name, value in message.properties.items():
        if name in _RESERVED:
            raise invalid(
                f"{where}.properties: {quote(name)} is set by the gateway; use the "
                f"{_RESERVED[name]} field instead"
            )
        if name in SCHEDULE_BOOKKEEPING:
            raise invalid(
                f"{where}.properties: {quote(name)} is set by the broker for delayed and "
                "timed messages; use the delay_level, deliver_at_ms or delay_ms field instead"
            )
        error = property_error(name, value)
        if error:
            raise invalid(f"{where}.properties: {error}")
        total += len(name.encode()) + len(value.encode()) + 2
    _check_unique_key(where, message.unique_key)
    _check_transactional(where, message)
    if message.WhichOneof("route") == "sharding_key":
        # Stored as __SHARDINGKEY on a FIFO topic (records.py): a property's rules.
        error = property_error(SHARDING_KEY, message.sharding_key)
        if error:
            raise invalid(f"{where}.sharding_key: {error}")
        total += len(SHARDING_KEY) + len(message.sharding_key.encode()) + 2
    total += len(UNIQ_KEY) + max(len(message.unique_key), 32) + 2
    if total > PROPERTIES_MAX_BYTES:
        raise invalid(
            f"{where}: tags, keys, unique key and properties take about {total} bytes; "
            f"the limit is {limit_text('PROPERTIES_MAX_BYTES')}"
        )
    if message.born_timestamp_ms < 0:
        raise invalid(f"{where}.born_timestamp_ms must be >= 0 (got {message.born_timestamp_ms})")
    delay_error = static_delay_error(where, message)
    if delay_error:
        raise invalid(delay_error)
    route = message.WhichOneof("route")
    if route == "queue":
        check_broker_name(message.queue.broker_name, f"{where}.queue.broker_name")
        check_queue_id(message.queue.queue_id, f"{where}.queue.queue_id")


def _check_tags(where: str, tags: str) -> int:
    """Refuse a tag no subscription can select (tide.naming.tag_error); its encoded size."""
    if not tags:
        return 0
    error = tag_error(tags) or property_error(TAGS, tags)
    if error:
        raise invalid(f"{where}.tags: {error}")
    return len(tags.encode()) + len(TAGS) + 2


def _check_keys(where: str, keys: Sequence[str]) -> int:
    """Each key on its own (their count and lengths were checked first, tide.limits:
    the dispatch indexes every key); returns the keys' encoded size."""
    total = len(KEYS) + 2 if keys else 0
    for key_index, key in enumerate(keys):
        if not key or " " in key:
            raise invalid(
                f"{where}.keys[{key_index}] {quote(key)} is empty or contains a space "
                "(keys are stored space separated): give each key on its own"
            )
        error = property_error(KEYS, key)
        if error:
            raise invalid(f"{where}.keys[{key_index}]: {error}")
        total += len(key.encode()) + 1
    return total


def _check_unique_key(where: str, unique_key: str) -> None:
    if not unique_key:
        return
    if len(unique_key) > UNIQUE_KEY_MAX_CHARS:
        raise invalid(
            f"{where}.unique_key is {len(unique_key)} characters; the limit is "
            f"{limit_text('UNIQUE_KEY_MAX_CHARS')} (leave it empty to have one generated)"
        )
    if any(char.isspace() for char in unique_key) or property_error(UNIQ_KEY, unique_key):
        raise invalid(
            f"{where}.unique_key {quote(unique_key)} contains a space or a reserved "
            "character (leave it empty to have one generated)"
        )


def _check_transactional(where: str, message: pb.ProduceMessage) -> None:
    """A half message names its producer group (the check-back asks a live producer of
    it); its transaction id is a unique key's kind of text."""
    if not message.transactional:
        if message.producer_group or message.transaction_id:
            raise invalid(
                f"{where}: producer_group and transaction_id are for a transactional "
                "message; set transactional or leave them empty"
            )
        return
    if not message.producer_group:
        raise invalid(f"{where}.producer_group is empty; a transactional message needs one")
    error = consumer_group_error(message.producer_group)
    if error:
        raise invalid(f"{where}.producer_group: {error}")
    transaction_id = message.transaction_id
    if any(char.isspace() for char in transaction_id) or property_error(
        TRANSACTION_ID, transaction_id
    ):
        raise invalid(
            f"{where}.transaction_id {quote(transaction_id)} contains a space or a reserved "
            "character (\\x01, \\x02)"
        )

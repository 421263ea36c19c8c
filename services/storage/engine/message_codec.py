"""From producer messages to encoded records: validation with clear errors, then encoding.

Everything here runs before the append lock is taken. A batch is validated as a whole:
the first invalid message rejects the batch and nothing is written.

The codec reads any object shaped like :class:`MessageLike`: the engine's own
:class:`MessageInput` or the ``tide.v1.Message`` protobuf itself (so the service does not
copy every message into another object first). This is the hottest Python in the
store; checks that usually pass are done once per message on whole strings.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.storage.engine.errors import InvalidMessageError
from tide.format import (
    KEYS,
    MAX_PROPERTIES_BYTES,
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_STORE_HOST_V6,
    TAGS,
    EncodedRecord,
    HostAddress,
    encode_record,
    pack_host,
    parse_host,
    property_error,
)
from tide.limits import KEYS_MAX_COUNT, limit_text
from tide.naming import TAG_MAX_CHARS, tag_error, topic_error
from tide.quoting import quote

# sys_flag bits a producer may set: compression, multi tags, transaction type and
# compression type. The host bits belong to the store.
PRODUCER_SYSFLAG_MASK = 0b111_0000_1111
MAX_CACHED_NAMES = 100_000
# A tag alone always fits the properties (UTF-8: at most 4 bytes a character).
assert len(TAGS) + 2 + 4 * TAG_MAX_CHARS <= MAX_PROPERTIES_BYTES


class MessageLike(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    @property
    def tags(self) -> str: ...
    @property
    def keys(self) -> Sequence[str]: ...
    @property
    def properties(self) -> Mapping[str, str]: ...
    @property
    def flag(self) -> int: ...
    @property
    def born_timestamp_ms(self) -> int: ...
    @property
    def born_host(self) -> str: ...
    @property
    def sys_flag(self) -> int: ...
    @property
    def reconsume_times(self) -> int: ...
    @property
    def prepared_transaction_offset(self) -> int: ...


@dataclass(slots=True)
class MessageInput:
    """A message for in-process callers (tests, benchmarks, tools)."""

    topic: str
    queue_id: int
    body: bytes
    tags: str = ""
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    born_timestamp_ms: int = 0
    # "ip:port" or "[ipv6]:port"; empty: the caller's default (the gRPC peer).
    born_host: str = ""
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


class MessageCodec:
    """Validates and encodes messages for one store (its host, its limits)."""

    def __init__(self, store_host: HostAddress, max_body_bytes: int) -> None:
        self._store_host = pack_host(store_host)
        self._store_flag = SYSFLAG_STORE_HOST_V6 if store_host.is_v6 else 0
        self._max_body_bytes = max_body_bytes
        self._topics: dict[str, bytes] = {}  # checked topics -> their UTF-8 bytes
        self._hosts: dict[str, tuple[bytes, int]] = {}

    def encode_batch(
        self,
        messages: Sequence[MessageLike],
        queue_counts: Mapping[str, int],
        default_born_host: str = "",
    ) -> list[EncodedRecord]:
        """``queue_counts`` maps each topic of the batch to its write queue count;
        ``default_born_host`` is used for messages without one (the store's own host if
        empty)."""
        now_ms = time.time_ns() // 1_000_000
        default_host = self.born_host(default_born_host) if default_born_host else None
        if default_host is None:
            default_host = (self._store_host, SYSFLAG_BORN_HOST_V6 if self._store_flag else 0)
        records: list[EncodedRecord] = []
        append = records.append
        topics = self._topics
        hosts = self._hosts
        store_host = self._store_host
        store_flag = self._store_flag
        max_body = self._max_body_bytes
        for index, msg in enumerate(messages):
            # The checks that usually pass inline; anything unusual (an unchecked topic, a
            # born host not parsed yet, a value out of range) goes through _encode, which
            # raises or encodes. Either way tide.format's encoder lays the record out.
            topic = msg.topic
            topic_bytes = topics.get(topic)
            queue_id = msg.queue_id
            body = msg.body
            sys_flag = msg.sys_flag
            born_text = msg.born_host
            born = hosts.get(born_text) if born_text else default_host
            if (
                topic_bytes is None
                or born is None
                or not 0 <= queue_id < queue_counts[topic]
                or len(body) > max_body
                or sys_flag & ~PRODUCER_SYSFLAG_MASK
            ):
                try:
                    if born is None:
                        born = self.born_host(born_text)
                    append(self._encode(msg, queue_counts, now_ms, born))
                except InvalidMessageError as exc:
                    raise InvalidMessageError(f"message[{index}]: {exc}") from None
                continue
            try:
                properties = encode_message_properties(msg.tags, msg.keys, msg.properties)
            except InvalidMessageError as exc:
                raise InvalidMessageError(f"message[{index}]: {exc}") from None
            append(
                encode_record(
                    topic,
                    topic_bytes,
                    queue_id,
                    body,
                    properties,
                    msg.flag,
                    sys_flag | store_flag | born[1],
                    msg.born_timestamp_ms or now_ms,
                    born[0],
                    store_host,
                    msg.reconsume_times,
                    msg.prepared_transaction_offset,
                )
            )
        return records

    def _encode_each(
        self,
        messages: Sequence[MessageLike],
        queue_counts: Mapping[str, int],
        now_ms: int,
        default_host: tuple[bytes, int],
    ) -> list[EncodedRecord]:
        records = []
        for index, msg in enumerate(messages):
            try:
                host = self.born_host(msg.born_host) if msg.born_host else default_host
                records.append(self._encode(msg, queue_counts, now_ms, host))
            except InvalidMessageError as exc:
                raise InvalidMessageError(f"message[{index}]: {exc}") from None
        return records

    def topic_bytes(self, topic: str) -> bytes:
        """The topic's UTF-8 bytes after checking the name (cached)."""
        cached = self._topics.get(topic)
        if cached is not None:
            return cached
        error = topic_error(topic)
        if error is not None:
            raise InvalidMessageError(error)
        encoded = topic.encode("utf-8")
        if len(self._topics) < MAX_CACHED_NAMES:
            self._topics[topic] = encoded
        return encoded

    def born_host(self, text: str) -> tuple[bytes, int]:
        """(packed address, sys_flag bit) for ``ip:port`` (cached)."""
        cached = self._hosts.get(text)
        if cached is not None:
            return cached
        try:
            host = parse_host(text)
        except ValueError as exc:
            raise InvalidMessageError(f"born_host: {exc}") from None
        result = (pack_host(host), SYSFLAG_BORN_HOST_V6 if host.is_v6 else 0)
        if len(self._hosts) < MAX_CACHED_NAMES:
            self._hosts[text] = result
        return result

    def _encode(
        self,
        msg: MessageLike,
        queue_counts: Mapping[str, int],
        now_ms: int,
        born: tuple[bytes, int],
    ) -> EncodedRecord:
        topic = msg.topic
        topic_bytes = self._topics.get(topic) or self.topic_bytes(topic)
        queue_id = msg.queue_id
        if not 0 <= queue_id < queue_counts[topic]:
            count = queue_counts[topic]
            raise InvalidMessageError(
                f"queue_id {queue_id} is outside the {count} write queues of topic "
                f"{quote(topic)} (0..{count - 1})"
            )
        body = msg.body
        if len(body) > self._max_body_bytes:
            raise InvalidMessageError(
                f"body is {len(body)} bytes; the limit is {self._max_body_bytes} "
                "(--max-message-body-bytes)"
            )
        sys_flag = msg.sys_flag
        if sys_flag & ~PRODUCER_SYSFLAG_MASK:
            raise InvalidMessageError(
                f"sys_flag {sys_flag:#x} sets bits reserved for the store (host IPv6 bits)"
            )
        return encode_record(
            topic,
            topic_bytes,
            queue_id,
            body,
            encode_message_properties(msg.tags, msg.keys, msg.properties),
            msg.flag,
            sys_flag | self._store_flag | born[1],
            msg.born_timestamp_ms or now_ms,
            born[0],
            self._store_host,
            msg.reconsume_times,
            msg.prepared_transaction_offset,
        )


def encode_message_properties(
    tags: str, keys: Sequence[str], properties: Mapping[str, str]
) -> bytes:
    """User properties, then TAGS and KEYS, as ``name\x01value\x02`` UTF-8.

    Checks run on whole strings, which is cheap: the text must hold exactly one ``\x01``
    and one ``\x02`` per property, and the joined keys exactly ``len(keys) - 1`` single
    spaces. Only when a check fails is each part looked at, to say which one is wrong.
    """
    if tags and not keys and not properties:  # a tag alone, the common case: its text is
        error = tag_error(tags)  # checked whole (no control character, a bounded length)
        if error is not None:
            raise InvalidMessageError(error)
        return f"{TAGS}\x01{tags}\x02".encode()
    text = ""
    count = 0
    if properties:
        if "" in properties:
            raise InvalidMessageError("a property name is empty")
        count = len(properties)
        if count == 1:  # the common case (a producer's UNIQ_KEY): no comprehension
            (name,) = properties
            text = f"{name}\x01{properties[name]}\x02"
        else:  # names, then a lookup each: a protobuf map's items() is the slow generic view
            text = "".join([f"{name}\x01{properties[name]}\x02" for name in properties])
    if tags:
        error = tag_error(tags)  # produce's rule: a tag a subscription can select
        if error is not None:
            raise InvalidMessageError(error)
        text += f"{TAGS}\x01{tags}\x02"
        count += 1
    if keys:
        if len(keys) > KEYS_MAX_COUNT:  # the dispatch indexes every key: bounded here
            raise InvalidMessageError(
                f"keys has {len(keys)} keys; the limit is {limit_text('KEYS_MAX_COUNT')}"
            )
        joined = " ".join(keys)
        if (
            joined.count(" ") != len(keys) - 1
            or "  " in joined
            or not joined
            or joined[0] == " "
            or joined[-1] == " "
        ):
            raise InvalidMessageError(
                "a key is empty or contains a space (keys are stored space separated)"
            )
        text += f"{KEYS}\x01{joined}\x02"
        count += 1
    if not count:
        return b""
    if text.count("\x01") != count or text.count("\x02") != count:
        _raise_property_error(tags, keys, properties)
    encoded = text.encode("utf-8")
    if len(encoded) > MAX_PROPERTIES_BYTES:
        raise InvalidMessageError(
            f"properties encode to {len(encoded)} bytes; the limit is {MAX_PROPERTIES_BYTES}"
        )
    return encoded


def _raise_property_error(tags: str, keys: Sequence[str], properties: Mapping[str, str]) -> None:
    checks = [*properties.items(), (TAGS, tags), *((KEYS, key) for key in keys)]
    for name, value in checks:
        error = property_error(name, value)
        if error is not None:
            raise InvalidMessageError(error)
    raise AssertionError("separator count mismatch without a bad property")

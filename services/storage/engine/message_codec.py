"""From producer messages to encoded records: validation with clear errors, then encoding.

Everything here runs before the append lock is taken. A batch is validated as a whole:
the first invalid message rejects the batch and nothing is written.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from services.storage.engine.errors import InvalidMessageError
from tide.format import (
    KEYS,
    MAX_PROPERTIES_BYTES,
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_STORE_HOST_V6,
    TAGS,
    EncodedRecord,
    HostAddress,
    encode_properties,
    encode_record,
    pack_host,
    property_error,
)
from tide.naming import topic_error

# sys_flag bits a producer may set: compression, multi tags, transaction type and
# compression type. The host bits belong to the store.
PRODUCER_SYSFLAG_MASK = 0b111_0000_1111


@dataclass(slots=True)
class MessageInput:
    topic: str
    queue_id: int
    body: bytes
    tags: str = ""
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    born_timestamp_ms: int = 0
    born_host: HostAddress | None = None
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


class MessageCodec:
    """Validates and encodes messages for one store (its host, its limits)."""

    def __init__(self, store_host: HostAddress, max_body_bytes: int) -> None:
        self._store_host = pack_host(store_host)
        self._store_flag = SYSFLAG_STORE_HOST_V6 if store_host.is_v6 else 0
        self._max_body_bytes = max_body_bytes
        self._valid_topics: dict[str, bytes] = {}
        self._default_born_host = self._store_host

    def encode_batch(
        self, messages: Sequence[MessageInput], queue_counts: Mapping[str, int]
    ) -> list[EncodedRecord]:
        """``queue_counts`` maps each topic of the batch to its write queue count."""
        now_ms = time.time_ns() // 1_000_000
        records = []
        for index, msg in enumerate(messages):
            try:
                records.append(self._encode(msg, queue_counts, now_ms))
            except InvalidMessageError as exc:
                raise InvalidMessageError(f"message[{index}]: {exc}") from None
        return records

    def topic_bytes(self, topic: str) -> bytes:
        cached = self._valid_topics.get(topic)
        if cached is not None:
            return cached
        error = topic_error(topic)
        if error is not None:
            raise InvalidMessageError(error)
        encoded = topic.encode("utf-8")
        if len(self._valid_topics) < 100_000:
            self._valid_topics[topic] = encoded
        return encoded

    def _encode(
        self, msg: MessageInput, queue_counts: Mapping[str, int], now_ms: int
    ) -> EncodedRecord:
        topic_bytes = self.topic_bytes(msg.topic)
        queue_count = queue_counts[msg.topic]
        if not 0 <= msg.queue_id < queue_count:
            raise InvalidMessageError(
                f"queue_id {msg.queue_id} is outside topic {msg.topic!r}'s "
                f"{queue_count} write queues (0..{queue_count - 1})"
            )
        if len(msg.body) > self._max_body_bytes:
            raise InvalidMessageError(
                f"body is {len(msg.body)} bytes; the limit is {self._max_body_bytes} "
                "(--max-message-body-bytes)"
            )
        if msg.sys_flag & ~PRODUCER_SYSFLAG_MASK:
            raise InvalidMessageError(
                f"sys_flag {msg.sys_flag:#x} sets bits reserved for the store (host IPv6 bits)"
            )
        properties_bytes = self._properties(msg)
        sys_flag = msg.sys_flag | self._store_flag
        born_host = self._default_born_host
        if msg.born_host is not None:
            born_host = pack_host(msg.born_host)
            if msg.born_host.is_v6:
                sys_flag |= SYSFLAG_BORN_HOST_V6
        elif self._store_flag:
            sys_flag |= SYSFLAG_BORN_HOST_V6
        return encode_record(
            msg.topic,
            topic_bytes,
            msg.queue_id,
            msg.body,
            properties_bytes,
            msg.flag,
            sys_flag,
            msg.born_timestamp_ms or now_ms,
            born_host,
            self._store_host,
            msg.reconsume_times,
            msg.prepared_transaction_offset,
        )

    @staticmethod
    def _properties(msg: MessageInput) -> bytes:
        if not (msg.tags or msg.keys or msg.properties):
            return b""
        props = dict(msg.properties)
        for name, value in props.items():
            error = property_error(name, value)
            if error is not None:
                raise InvalidMessageError(error)
        if msg.tags:
            if property_error(TAGS, msg.tags) is not None:
                raise InvalidMessageError("tags contain a reserved \\x01 or \\x02 character")
            props[TAGS] = msg.tags
        if msg.keys:
            for key in msg.keys:
                if not key or " " in key or property_error(KEYS, key) is not None:
                    raise InvalidMessageError(
                        f"key {key[:40]!r} is empty or contains a space or \\x01/\\x02 "
                        "(keys are stored space separated)"
                    )
            props[KEYS] = " ".join(msg.keys)
        encoded = encode_properties(props)
        if len(encoded) > MAX_PROPERTIES_BYTES:
            raise InvalidMessageError(
                f"properties encode to {len(encoded)} bytes; the limit is {MAX_PROPERTIES_BYTES}"
            )
        return encoded

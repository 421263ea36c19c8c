"""Decode a Pull answer's commitlog records (``PullResponse.records``) into messages.

A gateway asked for ``ENCODING_RECORDS`` sends the FOUND messages as the stored commitlog
records, back to back, in queue order (docs/formats.md, "Commitlog"); the client decodes
them here, as RocketMQ's client does with the records its broker sends. Each message is
the :class:`ReceivedMessage` that ``from_stored_message`` gives for the ``StoredMessage``
a storage builds from the same record.

This is the consumer's hot path. The records are read by tide.format, the one reader of
the layout: the common ones (1-byte topic length, IPv4 hosts) all at once by
``v4_record_fields`` (in the compiled core when it is built), their hosts, message id
prefixes and queues cached for the call; when that declines (any other record, or damage),
each record goes through :func:`tide.format.decode_record`. Both check the same things
(size, magic, field lengths, body CRC, UTF-8 topic); the second names the record that
fails in a :class:`TideError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tide.client._errors import TideError
from tide.client._types import MessageQueue, ReceivedMessage
from tide.format import (
    FIXED_BYTES_V4,
    KEYS,
    TAGS,
    UNIQ_KEY,
    DecodedRecord,
    RecordError,
    decode_record,
    make_msg_id,
    msg_id_prefix,
    record_total_size,
    unpack_host,
)
from tide.format._record_spans import (
    RecordFields,
    v4_record_fields,
    v4_record_fields_python,
)
from tide.tail import gc_paused

_new_object = object.__new__
_set_attribute = object.__setattr__


class _Decoder:
    """Decodes the records of one Pull answer; caches what repeats across its records."""

    __slots__ = ("broker_name", "hosts", "id_prefixes", "queues", "records")

    def __init__(self, broker_name: str, records: bytes) -> None:
        self.broker_name = broker_name
        self.records = records
        self.hosts: dict[bytes, str] = {}  # packed IPv4 host -> "ip:port"
        self.id_prefixes: dict[bytes, str] = {}  # packed store host -> message id prefix
        self.queues: dict[tuple[bytes, int], MessageQueue] = {}  # (topic bytes, queue id)

    def error(self, index: int, pos: int, what: str) -> TideError:
        return TideError(
            f"Pull answer from broker {self.broker_name!r}: record {index} "
            f"(at byte {pos} of {len(self.records)}): {what}"
        )

    def record_size(self, index: int, pos: int) -> int:
        """The TOTALSIZE of the record at ``pos``, checked to fit the bytes left."""
        left = len(self.records) - pos
        if left < 4:
            raise self.error(index, pos, f"{left} bytes left, too few for a record")
        size = record_total_size(self.records, pos)
        if size < FIXED_BYTES_V4 or size > left:
            raise self.error(
                index, pos, f"TOTALSIZE {size} is outside [{FIXED_BYTES_V4}, {left} bytes left]"
            )
        return size

    def strict_queue(self, topic: bytes, queue_id: int) -> MessageQueue:
        """The record's queue; raises UnicodeDecodeError when the topic is not UTF-8."""
        queue = MessageQueue(topic.decode("utf-8"), self.broker_name, queue_id)
        self.queues[topic, queue_id] = queue
        return queue

    def host(self, packed: bytes) -> str:
        """``ip:port`` of a packed IPv4 host (as ``str(unpack_host(packed))``), cached."""
        text = self.hosts[packed] = str(unpack_host(packed))
        return text

    def id_prefix(self, store: bytes) -> str:
        """The message id prefix of a packed store host (``msg_id_prefix``), cached."""
        prefix = self.id_prefixes[store] = store.hex().upper()
        return prefix

    def general_message(self, index: int, pos: int, size: int) -> ReceivedMessage:
        """Any record (IPv6 hosts, 2-byte topic length) through ``decode_record``."""
        try:
            record = decode_record(self.records, pos, pos + size)
        except RecordError as exc:
            raise self.error(index, pos, str(exc)) from None
        if record.physical_offset < 0:
            raise self.error(index, pos, f"physical offset {record.physical_offset} is negative")
        return received_message(self.broker_name, record)


def received_message(broker_name: str, record: DecodedRecord) -> ReceivedMessage:
    """The message of a decoded record: what the storage's ``StoredMessage`` of it gives."""
    props = record.properties
    keys = props.get(KEYS)
    return ReceivedMessage(
        queue=MessageQueue(record.topic, broker_name, record.queue_id),
        queue_offset=record.queue_offset,
        body=record.body,
        tags=props.get(TAGS, ""),
        keys=tuple(keys.split(" ")) if keys else (),
        properties=props,
        msg_id=make_msg_id(msg_id_prefix(record.store_host), record.physical_offset),
        unique_key=props.get(UNIQ_KEY, ""),
        born_timestamp_ms=record.born_timestamp_ms,
        store_timestamp_ms=record.store_timestamp_ms,
        born_host=str(record.born_host),
        store_host=str(record.store_host),
        reconsume_times=record.reconsume_times,
        physical_offset=record.physical_offset,
        size_bytes=record.total_size,
    )


def decode_pull_records(
    broker_name: str, records: bytes, record_count: int
) -> tuple[ReceivedMessage, ...]:
    """The ``record_count`` messages of ``records`` (commitlog records back to back), in
    order; raise :class:`TideError` naming the record when the bytes are not exactly that
    many valid records."""
    return _decode(broker_name, records, record_count, v4_record_fields)


def decode_pull_records_python(
    broker_name: str, records: bytes, record_count: int
) -> tuple[ReceivedMessage, ...]:
    """:func:`decode_pull_records` on the pure-Python reader even when the compiled core
    is built (tests/client/test_records_ccore.py holds the two equal)."""
    return _decode(broker_name, records, record_count, v4_record_fields_python)


def _decode(
    broker_name: str,
    records: bytes,
    record_count: int,
    read_fields: Callable[[bytes, int], RecordFields | None],
) -> tuple[ReceivedMessage, ...]:
    # tide.format reads the fields of common records (V1 magic, IPv4 hosts) and checks
    # them, all at once; anything else, and every error, goes record by record through
    # tide.format.decode_record, and the error names the record that fails.
    decoder = _Decoder(broker_name, records)
    # A few objects per message that form no cycles: young collections that traverse
    # them while the answer is decoded cost ~2 us a message (bench/pull_spans.py).
    with gc_paused():
        fields = read_fields(records, record_count)
        if fields is not None:
            try:
                return _messages(decoder, fields)
            except UnicodeDecodeError:  # a topic that is not UTF-8: named below
                pass
        return _one_by_one(decoder, record_count)


def _messages(decoder: _Decoder, fields: RecordFields) -> tuple[ReceivedMessage, ...]:
    """The messages of the records whose fields ``v4_record_fields`` read."""
    return tuple(
        _new_message(
            {
                "queue": decoder.queues.get((topic, queue_id))
                or decoder.strict_queue(topic, queue_id),
                "queue_offset": queue_offset,
                "body": body,
                "tags": props.get(TAGS, ""),
                "keys": tuple(keys.split(" ")) if (keys := props.get(KEYS)) else (),
                "properties": props,
                "msg_id": f"{decoder.id_prefixes.get(store) or decoder.id_prefix(store)}"
                f"{physical_offset:016X}",
                "unique_key": props.get(UNIQ_KEY, ""),
                "born_timestamp_ms": born_ms,
                "store_timestamp_ms": store_ms,
                "born_host": decoder.hosts.get(born) or decoder.host(born),
                "store_host": decoder.hosts.get(store) or decoder.host(store),
                "reconsume_times": reconsume_times,
                "physical_offset": physical_offset,
                "size_bytes": size,
            }
        )
        for (
            size,
            queue_id,
            queue_offset,
            physical_offset,
            born_ms,
            store_ms,
            born,
            store,
            reconsume_times,
            body,
            topic,
            props,
        ) in zip(*fields, strict=True)
    )


def _new_message(attributes: dict[str, Any]) -> ReceivedMessage:
    """A ReceivedMessage of every field at once: a frozen dataclass's ``__init__`` sets
    its 15 fields one ``object.__setattr__`` at a time, ~2 us a message, a third of the
    decoding. It has no ``__post_init__`` and no slots (tests/client/test_records.py
    compares these messages with constructed ones)."""
    message = _new_object(ReceivedMessage)
    _set_attribute(message, "__dict__", attributes)
    return message


def _one_by_one(decoder: _Decoder, record_count: int) -> tuple[ReceivedMessage, ...]:
    """The messages of the records, each through ``decode_record``."""
    records = decoder.records
    messages: list[ReceivedMessage] = []
    end = len(records)
    pos = 0
    while pos < end:
        index = len(messages)
        if index == record_count:
            raise decoder.error(
                index, pos, f"{end - pos} bytes follow the {record_count} records announced"
            )
        size = decoder.record_size(index, pos)
        messages.append(decoder.general_message(index, pos, size))
        pos += size
    if len(messages) != record_count:
        raise TideError(
            f"Pull answer from broker {decoder.broker_name!r}: {len(messages)} records in "
            f"{end} bytes, {record_count} announced"
        )
    return tuple(messages)

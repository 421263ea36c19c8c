"""A produce request of bodies only, read from its serialized form (the gateway's side).

The common request of a high-throughput producer is a batch of messages of one topic,
each only that topic and a body. Told from the request's protobuf encoding, such a
batch needs no Python object per message: :func:`scan_bodies` says whether the request
is one (and its topic and message count), :func:`encode_bodies_run` lays its messages
out as a record run (:class:`~tide.format.RunWriter`'s layout, the ``UNIQ_KEY``
property only), reading the bodies from the same bytes. The compiled core does both in
one pass each (``tide.format._ccore``); the ``_python`` functions are their references.

The wire (protobuf's encoding of ``tide.v1.ProduceRequest``): field 1 ``messages``
(length-delimited, tag 0x0A) and field 2 ``compact_results`` (varint, tag 0x10); a
``ProduceMessage`` is field 1 ``topic`` (0x0A) and field 2 ``body`` (0x12). Any other
field, a field twice, an empty or missing topic or body, or a body over the limit, and
the request is not one of bodies only: None, and the caller checks it field by field
(which names what is wrong).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from tide.format import _core
from tide.format._record_run import RunWriter

_MESSAGES_TAG = 0x0A
_COMPACT_TAG = 0x10
_PACK_ANSWERS_TAG = 0x18  # ProduceRequest.pack_answers: like compact_results, answer-only
_TOPIC_TAG = 0x0A
_BODY_TAG = 0x12
_VARINT_MAX_BYTES = 10
ScanBodies: TypeAlias = Callable[[bytes, int], "tuple[bytes, int] | None"]
EncodeBodiesRun: TypeAlias = Callable[[bytes, int, bytes, int, list[str], bytes, int, bytes], bytes]
# The compiled twins (typed by tide/format/_ccore.pyi), or None: the pure-Python path.
_compiled_scan: ScanBodies | None = None if _core.ccore is None else _core.ccore.scan_bodies
_compiled_encode: EncodeBodiesRun | None = (
    None if _core.ccore is None else _core.ccore.encode_bodies_run
)
_compiled_keys: Callable[[str, int, int], list[str]] | None = (
    None if _core.ccore is None else _core.ccore.numbered_keys
)


class _NotBodies(Exception):
    """The request is not one of bodies only (or is cut short)."""


def scan_bodies(request: bytes, max_body_bytes: int) -> tuple[bytes, int] | None:
    """(topic as UTF-8, message count) when the serialized ``request`` has messages of
    one topic, each only that topic and a body of 1..``max_body_bytes`` bytes (besides
    them only ``compact_results`` and ``pack_answers``); else None. The compiled core's
    when it runs."""
    if _compiled_scan is not None:
        return _compiled_scan(request, max_body_bytes)
    return scan_bodies_python(request, max_body_bytes)


def encode_bodies_run(
    writer: RunWriter,
    request: bytes,
    magic: int,
    topic_part: bytes,
    queue_id: int,
    unique_keys: list[str],
    uniq_key_name: str,
    born_timestamp_ms: int,
) -> None:
    """The messages of ``request`` (which :func:`scan_bodies` took) as records of queue
    ``queue_id`` into ``writer``: what ``writer.add_many`` gives for their bodies with
    the properties ``uniq_key_name\\x01unique_keys[i]\\x02``."""
    if _compiled_encode is None or len(writer.born_host) != 8:
        encode_bodies_run_python(
            writer,
            request,
            magic,
            topic_part,
            queue_id,
            unique_keys,
            uniq_key_name,
            born_timestamp_ms,
        )
        return
    writer.add_run(
        _compiled_encode(
            request,
            magic,
            topic_part,
            queue_id,
            unique_keys,
            uniq_key_name.encode(),
            born_timestamp_ms,
            writer.born_host,
        ),
        len(unique_keys),
    )


def numbered_keys(head: str, first: int, count: int) -> list[str]:
    """``head`` followed by the 4 upper-case hex digits of ``(first + i) & 0xFFFF``, for
    each i below ``count``: a batch's unique keys (services/gateway/uniq.py). The
    compiled core's when it runs (``head`` ASCII)."""
    if _compiled_keys is not None:
        return _compiled_keys(head, first, count)
    return numbered_keys_python(head, first, count)


def numbered_keys_python(head: str, first: int, count: int) -> list[str]:
    """:func:`numbered_keys` in Python: the reference of ``_ccore.numbered_keys``."""
    return [f"{head}{counter & 0xFFFF:04X}" for counter in range(first, first + count)]


def scan_bodies_python(request: bytes, max_body_bytes: int) -> tuple[bytes, int] | None:
    """:func:`scan_bodies` in Python: the reference of ``_ccore.scan_bodies``."""
    try:
        bodies = _bodies(request)
    except _NotBodies:
        return None
    if not bodies:
        return None
    topic = bodies[0][0]
    for message_topic, body in bodies:
        if message_topic != topic or len(body) > max_body_bytes:
            return None
    return topic, len(bodies)


def encode_bodies_run_python(
    writer: RunWriter,
    request: bytes,
    magic: int,
    topic_part: bytes,
    queue_id: int,
    unique_keys: list[str],
    uniq_key_name: str,
    born_timestamp_ms: int,
) -> None:
    """:func:`encode_bodies_run` in Python: the reference of
    ``_ccore.encode_bodies_run`` (the properties as the gateway's plain batch makes
    them, services/gateway/produce_plain.py)."""
    try:
        bodies = [body for _, body in _bodies(request)]
    except _NotBodies as exc:
        raise ValueError(f"encode_bodies_run: not a request of bodies only: {exc}") from None
    if len(bodies) != len(unique_keys):
        raise ValueError(
            f"encode_bodies_run: {len(bodies)} messages, {len(unique_keys)} unique keys"
        )
    properties = [f"{uniq_key_name}\x01{key}\x02".encode() for key in unique_keys]
    writer.add_many_python(
        magic, topic_part, [queue_id] * len(bodies), bodies, properties, born_timestamp_ms
    )


def _bodies(request: bytes) -> list[tuple[bytes, bytes]]:
    """(topic, body) of each message; raises _NotBodies."""
    found: list[tuple[bytes, bytes]] = []
    view = memoryview(request)
    at, end = 0, len(request)
    while at < end:
        tag = request[at]
        at += 1
        if tag in (_COMPACT_TAG, _PACK_ANSWERS_TAG):
            _, at = _varint(request, at, end)
            continue
        if tag != _MESSAGES_TAG:
            raise _NotBodies(f"field tag 0x{tag:02X} of the request")
        start, at = _span(request, at, end)
        found.append(_message(bytes(view[start:at])))
    return found


def _message(data: bytes) -> tuple[bytes, bytes]:
    fields: dict[int, bytes] = {}
    at, end = 0, len(data)
    while at < end:
        tag = data[at]
        at += 1
        if tag not in (_TOPIC_TAG, _BODY_TAG) or tag in fields:
            raise _NotBodies(f"field tag 0x{tag:02X} of a message")
        start, at = _span(data, at, end)
        fields[tag] = data[start:at]
    topic, body = fields.get(_TOPIC_TAG, b""), fields.get(_BODY_TAG, b"")
    if not topic or not body:
        raise _NotBodies("a message without a topic or a body")
    return topic, body


def _span(data: bytes, at: int, end: int) -> tuple[int, int]:
    """A length-delimited field's bytes after its tag: (start, end)."""
    length, at = _varint(data, at, end)
    if length > end - at:
        raise _NotBodies("a field overruns its message")
    return at, at + length


def _varint(data: bytes, at: int, end: int) -> tuple[int, int]:
    value = shift = 0
    for _ in range(_VARINT_MAX_BYTES):
        if at >= end:
            break
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value & 0xFFFF_FFFF_FFFF_FFFF, at
        shift += 7
    raise _NotBodies("a varint cut short or over 10 bytes")


__all__ = [
    "encode_bodies_run",
    "encode_bodies_run_python",
    "numbered_keys",
    "numbered_keys_python",
    "scan_bodies",
    "scan_bodies_python",
]

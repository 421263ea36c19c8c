"""Answers framed by hand: protobuf's wire format around bytes that are already there.

A Tail chunk is ~120 KB of commitlog read out of a segment's mapping. Built as a
``TailChunk`` and serialized by grpc, its data is copied three times (out of the mapping,
into the message, out of the message into the serialized answer), each into a freshly
allocated buffer: 27-35 us a chunk read from a cold mapping on the 2-core box (with the
services' malloc settings; ~100 us without them) against 20-22 us for one copy out of
the mapping between a hand-made key and length (docs/performance.md, "Target 4 for the
storage, second round"). A stream's answer (``framed_answer``) is framed the same way
around its response's serialization, or around a response given in parts: the
dispatch's ``GetQueueEntriesStream`` answer is its response without the records, then
the records' field around views of the tail cache's buffers, joined in one copy
(docs/performance.md, "The dispatch's entries answer framed by hand"). The bytes are
those protobuf writes itself (``tests/server/test_framed.py`` and
``tests/services/dispatch/test_entries_stream.py`` hold them to it), so callers still
parse the messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import grpc

from tide.format import varint

# Keys of TailChunk's fields (field number << 3 | wire type): 1 and 3 varint, 2 bytes.
_TAIL_OFFSET_KEY = b"\x08"
_TAIL_DATA_KEY = b"\x12"
_TAIL_MAX_OFFSET_KEY = b"\x18"


def tail_chunk_frame(offset: int, size: int, max_offset: int) -> tuple[bytes, bytes]:
    """The bytes before and after ``size`` bytes of data in a serialized
    ``TailChunk(offset, data, max_offset)``, field by field as protobuf writes them (in
    field order; a field at its default, 0 or empty, is left out)."""
    head = b""
    if offset:
        head = _TAIL_OFFSET_KEY + varint(offset)
    if size:
        head += _TAIL_DATA_KEY + varint(size)
    tail = _TAIL_MAX_OFFSET_KEY + varint(max_offset) if max_offset else b""
    return head, tail


# The `response` field (1, length-delimited) of a stream's answer (AppendStreamResponse,
# ReadStreamResponse: storage.proto's in-band stream protocol).
_ANSWER_RESPONSE_KEY = b"\x0a"


class _Serializable(Protocol):
    def SerializeToString(self) -> bytes: ...


def framed_answer(answer_type: Callable[..., _Serializable]) -> Callable[..., bytes]:
    """A stream's ``answer`` (tide.server RequestStreams.serve) that gives the answer
    serialized: a response framed by hand around its own serialization (building the
    answer message copied the response into it first: ~3.7 us of an AppendStream's
    ~12 us a 100-record answer), an error as ``answer_type`` serializes it. The bytes
    are protobuf's (``tests/server/test_framed.py``). A response given as ``bytes`` is
    one already serialized (the storage's ``records`` answer, written by hand); given
    as a list, one serialized in parts, joined here in one copy (the dispatch's entries
    answer around its tail cache's views)."""

    def answer(
        response: _Serializable | bytes | list[bytes | memoryview] | None = None,
        **error: object,
    ) -> bytes:
        if response is None:
            return answer_type(**error).SerializeToString()
        if isinstance(response, list):
            size = sum(map(len, response))
            return b"".join((_ANSWER_RESPONSE_KEY, varint(size), *response))
        inner = response if isinstance(response, bytes) else response.SerializeToString()
        return b"".join((_ANSWER_RESPONSE_KEY, varint(len(inner)), inner))

    return answer


def serialized(message: bytes) -> bytes:
    """The response serializer of a method whose handler yields serialized answers."""
    return message


def add_with_serializers(
    add: Callable[[Any, Any], None],
    servicer: object,
    server: grpc.aio.Server,
    serializers: Mapping[str, Callable[[Any], bytes]],
) -> None:
    """``add(servicer, server)`` (a generated ``add_..._to_server``), with the response
    serializer of each method named in ``serializers`` replaced."""
    captured: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}

    class _Capture:
        def add_generic_rpc_handlers(self, _: object) -> None:
            pass  # registered below, from the same handlers

        def add_registered_method_handlers(
            self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
        ) -> None:
            captured[service] = handlers

    add(servicer, _Capture())
    ((service, handlers),) = captured.items()
    unknown = set(serializers) - set(handlers)
    if unknown:
        raise ValueError(f"{service} has no method {sorted(unknown)}")
    patched = {
        name: _with_serializer(handler, serializers[name]) if name in serializers else handler
        for name, handler in handlers.items()
    }
    # A generic handler only, as tide.server registers every service (_generic_handlers).
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, patched),))


def _with_serializer(
    handler: grpc.RpcMethodHandler[Any, Any], serializer: Callable[[Any], bytes]
) -> grpc.RpcMethodHandler[Any, Any]:
    """The same method (its kind, behaviour and request deserializer: grpc's documented
    handler attributes) rebuilt by grpc's public constructor with ``serializer``."""
    deserializer = handler.request_deserializer
    if handler.request_streaming and handler.response_streaming:
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            handler.stream_stream, deserializer, serializer
        )
    if handler.request_streaming:
        assert handler.stream_unary is not None
        return grpc.stream_unary_rpc_method_handler(handler.stream_unary, deserializer, serializer)
    if handler.response_streaming:
        assert handler.unary_stream is not None
        return grpc.unary_stream_rpc_method_handler(handler.unary_stream, deserializer, serializer)
    assert handler.unary_unary is not None
    return grpc.unary_unary_rpc_method_handler(handler.unary_unary, deserializer, serializer)

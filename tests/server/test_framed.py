"""tide.server._framed: hand-framed answers are the bytes protobuf writes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

from tide.format import varint
from tide.server._framed import (
    add_with_serializers,
    framed_answer,
    serialized,
    tail_chunk_frame,
)
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16383, 16384, 2_097_151, 2_097_152])
@pytest.mark.parametrize("offset", [0, 1, 127, 128, (1 << 35) + 5, -1])
def test_tail_chunk_frame_is_protobufs_tail_chunk(offset: int, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    for max_offset in (0, offset + size, 1 << 40):
        head, tail = tail_chunk_frame(offset, size, max_offset)
        expected = pb.TailChunk(offset=offset, data=data, max_offset=max_offset)
        assert head + data + tail == expected.SerializeToString()
        assert pb.TailChunk.FromString(head + data + tail) == expected


def _servicer() -> Any:
    """The generated base servicer (abstract to mypy; registering needs no method)."""
    return cast(Any, pb_grpc.StorageServicer)()


class _Server:
    def __init__(self) -> None:
        self.generic: list[grpc.GenericRpcHandler[Any, Any]] = []
        self.registered: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}

    def add_generic_rpc_handlers(
        self, handlers: tuple[grpc.GenericRpcHandler[Any, Any], ...]
    ) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.registered[service] = handlers

    def resolve(self, method: str) -> Any:
        """The handler grpc would find for ``method`` through the generic handlers."""
        details = cast(grpc.HandlerCallDetails, SimpleNamespace(method=method))
        found = [handler.service(details) for handler in self.generic]
        return next(handler for handler in found if handler is not None)


@pytest.mark.parametrize("name", ["Tail", "AppendStream", "Append"])
def test_add_with_serializers_replaces_only_the_named_method(name: str) -> None:
    """A server-streaming, a bidirectional and a unary method: each keeps its kind, its
    behaviour and its request deserializer, and only its response serializer changes."""
    servicer = _servicer()
    plain = _Server()
    pb_grpc.add_StorageServicer_to_server(servicer, cast(Any, plain))
    patched = _Server()
    add_with_serializers(
        pb_grpc.add_StorageServicer_to_server,
        servicer,
        patched,  # type: ignore[arg-type]
        {name: serialized},
    )
    before = plain.registered["tide.v1.Storage"]
    # registered as a generic handler only (tide/server/_generic_handlers.py)
    assert patched.registered == {}
    after = {method: patched.resolve(f"/tide.v1.Storage/{method}") for method in before}
    assert after[name].response_serializer is serialized
    assert after[name].response_serializer != before[name].response_serializer
    for attribute in (
        "request_streaming",
        "response_streaming",
        "request_deserializer",
        "unary_unary",
        "unary_stream",
        "stream_unary",
        "stream_stream",
    ):
        assert getattr(after[name], attribute) == getattr(before[name], attribute), attribute
    for other in set(before) - {name}:
        assert after[other].response_serializer == before[other].response_serializer
    assert len(patched.generic) == 1


def test_add_with_serializers_refuses_an_unknown_method() -> None:
    with pytest.raises(ValueError, match="no method"):
        add_with_serializers(
            pb_grpc.add_StorageServicer_to_server,
            _servicer(),
            _Server(),  # type: ignore[arg-type]
            {"Tale": serialized},
        )


def _response_of_size(inner_bytes: int) -> pb.AppendResponse:
    """An AppendResponse whose serialization is ``inner_bytes`` long (msg_id_prefix's
    length picked to land on the size; 0: the empty response)."""
    if inner_bytes == 0:
        return pb.AppendResponse()
    response = pb.AppendResponse(physical_offsets=[1 << 40] * 3, sizes=[230] * 3)
    fixed = len(response.SerializeToString())
    for prefix_bytes in range(inner_bytes - fixed - 4, inner_bytes - fixed + 1):
        response.msg_id_prefix = "P" * max(0, prefix_bytes)
        if len(response.SerializeToString()) == inner_bytes:
            return response
    raise AssertionError(f"no response of {inner_bytes} bytes")


@pytest.mark.parametrize("inner_bytes", [0, 40, 127, 128, 16383, 16384, 2_097_152])
def test_framed_answer_is_protobufs_stream_answer(inner_bytes: int) -> None:
    response = _response_of_size(inner_bytes)
    answer = framed_answer(pb.AppendStreamResponse)
    expected = pb.AppendStreamResponse(response=response)
    assert answer(response=response) == expected.SerializeToString()
    assert pb.AppendStreamResponse.FromString(answer(response=response)) == expected


def test_framed_answer_frames_a_response_given_serialized() -> None:
    response = pb.AppendResponse(msg_id_prefix="7F0000010000", physical_offsets=[1, 2])
    answer = framed_answer(pb.AppendStreamResponse)
    expected = pb.AppendStreamResponse(response=response).SerializeToString()
    assert answer(response.SerializeToString()) == expected == answer(response)


@pytest.mark.parametrize("records_bytes", [1, 127, 128, 16_384, 2_097_152])
def test_framed_answer_joins_a_response_given_in_parts(records_bytes: int) -> None:
    """The dispatch's entries answer: a response serialized in parts (its fields but
    ``records``, then that field's key and length and the records as a view), framed and
    joined in one copy: protobuf's bytes for the whole response in its stream answer."""
    records = (bytes(range(256)) * (records_bytes // 256 + 1))[:records_bytes]
    response = dispatch_pb.GetQueueEntriesResponse(next_offset=9, max_offset=9)
    response.spans.add(physical_offset=1 << 40, size=records_bytes, count=3)
    parts: list[bytes | memoryview] = [
        response.SerializeToString(),
        b"\x32",  # records: field 6, length-delimited, the last field
        varint(records_bytes),
        memoryview(records),
    ]
    answer = framed_answer(dispatch_pb.GetQueueEntriesStreamResponse)
    response.records = records
    whole = dispatch_pb.GetQueueEntriesStreamResponse(response=response)
    assert answer(parts) == whole.SerializeToString()


def test_framed_answer_serializes_an_error_as_the_message_does() -> None:
    answer = framed_answer(pb.AppendStreamResponse)
    framed = answer(error_code=3, error_message="records: record 1: bad")
    expected = pb.AppendStreamResponse(error_code=3, error_message="records: record 1: bad")
    assert framed == expected.SerializeToString()

"""Appends to one storage over a few long-lived ``Storage.AppendStream`` streams
(request_streams.py: one append at a time per stream, reused; the caller sees what a
unary ``Append`` would have given). The AppendQueue's call slots each take a stream, so a
storage gets as many streams as appends in flight.
"""

from __future__ import annotations

from typing import TypeAlias

import grpc

from services.gateway.request_streams import RequestStreamPool
from tide.v1 import storage_pb2 as storage_pb

METHOD = "/tide.v1.Storage/AppendStream"
# Requests arrive serialized (the AppendQueue encodes them).
AppendStreamPool: TypeAlias = RequestStreamPool[
    bytes, storage_pb.AppendStreamResponse, storage_pb.AppendResponse
]


def append_stream_pool(
    channel: grpc.aio.Channel, address: str, max_streams: int
) -> AppendStreamPool:
    return RequestStreamPool(
        channel,
        address,
        METHOD,
        storage_pb.AppendStreamResponse.FromString,
        _inner,
        max_streams,
    )


def _inner(answer: storage_pb.AppendStreamResponse) -> storage_pb.AppendResponse:
    return answer.response

"""A pull's two broker calls over long-lived streams: ``Dispatch.GetQueueEntriesStream``
and ``Storage.ReadStream`` (request_streams.py: one call at a time per stream, reused;
the caller sees what the unary ``GetQueueEntries`` / ``Read`` would have given).

Pulls of different queues run at once; each takes a free stream of the address, at most
READ_STREAMS_PER_ADDRESS, and the others wait for one (within the call's timeout, and
behind the per-address call limit of brokers.py).
"""

from __future__ import annotations

from typing import TypeAlias

import grpc

from services.gateway.request_streams import RequestStreamPool
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import storage_pb2 as storage_pb

# Streams per dispatch address and per storage address. A stream's call costs its server
# a few hundred microseconds at most: 4 keep a 2-core broker busy without piling up.
READ_STREAMS_PER_ADDRESS = 4
READ_METHOD = "/tide.v1.Storage/ReadStream"
ENTRIES_METHOD = "/tide.v1.Dispatch/GetQueueEntriesStream"

ReadStreamPool: TypeAlias = RequestStreamPool[
    storage_pb.ReadRequest, storage_pb.ReadStreamResponse, storage_pb.ReadResponse
]
EntriesStreamPool: TypeAlias = RequestStreamPool[
    dispatch_pb.GetQueueEntriesRequest,
    dispatch_pb.GetQueueEntriesStreamResponse,
    dispatch_pb.GetQueueEntriesResponse,
]


def read_stream_pool(channel: grpc.aio.Channel, address: str) -> ReadStreamPool:
    return RequestStreamPool(
        channel,
        address,
        READ_METHOD,
        storage_pb.ReadStreamResponse.FromString,
        _read_response,
        READ_STREAMS_PER_ADDRESS,
        storage_pb.ReadRequest.SerializeToString,
    )


def entries_stream_pool(channel: grpc.aio.Channel, address: str) -> EntriesStreamPool:
    return RequestStreamPool(
        channel,
        address,
        ENTRIES_METHOD,
        dispatch_pb.GetQueueEntriesStreamResponse.FromString,
        _entries_response,
        READ_STREAMS_PER_ADDRESS,
        dispatch_pb.GetQueueEntriesRequest.SerializeToString,
    )


def _read_response(answer: storage_pb.ReadStreamResponse) -> storage_pb.ReadResponse:
    return answer.response


def _entries_response(
    answer: dispatch_pb.GetQueueEntriesStreamResponse,
) -> dispatch_pb.GetQueueEntriesResponse:
    return answer.response

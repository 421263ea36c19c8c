"""The transaction service's calls to the storage it follows, on a channel of its own
(its reads and appends never queue behind a pull's Read)."""

from __future__ import annotations

import time

import grpc

from services.dispatch.storage_client import CHANNEL_OPTIONS
from tide.format import DecodedRecord, decode_record
from tide.server import traced_channel
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

CALL_TIMEOUT_S = 30.0  # a SYNC flush, or a SYNC_MASTER waiting for its slave
ROLE_REFRESH_S = 1.0
SLAVE_ROLE = "SLAVE"


class TxStorage:
    def __init__(self, target: str) -> None:
        self.target = target
        self._channel = traced_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.StorageStub(self._channel)
        self._master = False
        self._role_asked_at = float("-inf")

    async def close(self) -> None:
        await self._channel.close(None)

    async def read_raw(self, physical_offset: int, size: int) -> bytes | None:
        """The record's bytes at the position, or None when the storage no longer has it.
        Raises AioRpcError."""
        request = pb.ReadRequest(
            spans=[pb.RecordSpan(physical_offset=physical_offset, size=size, count=1)]
        )
        response: pb.ReadResponse = await self._stub.Read(request, timeout=CALL_TIMEOUT_S)
        if len(response.span_statuses) != 1 or response.span_statuses[0] != pb.FOUND:
            return None
        return response.records

    async def read_record(self, physical_offset: int, size: int) -> DecodedRecord | None:
        data = await self.read_raw(physical_offset, size)
        if data is None:
            return None
        return decode_record(data, 0, len(data), expected_offset=physical_offset)

    async def append(self, run: bytes) -> pb.AppendResponse:
        """One record run, all of it or none (the store's guarantee). Raises AioRpcError."""
        request = pb.AppendRequest(records=[run])
        response: pb.AppendResponse = await self._stub.Append(request, timeout=CALL_TIMEOUT_S)
        return response

    async def max_offset(self) -> int:
        status: pb.StorageStatus = await self._stub.GetStatus(
            pb.GetStatusRequest(), timeout=CALL_TIMEOUT_S
        )
        return status.max_offset

    async def is_master(self, *, fresh: bool = False) -> bool:
        """Whether the storage is a master, asked at most every ROLE_REFRESH_S (``fresh``:
        now); the last answer while it does not answer (False before any)."""
        now = time.monotonic()
        if not fresh and now - self._role_asked_at < ROLE_REFRESH_S:
            return self._master
        try:
            status: pb.StorageStatus = await self._stub.GetStatus(
                pb.GetStatusRequest(), timeout=ROLE_REFRESH_S * 5
            )
        except grpc.aio.AioRpcError:
            return self._master  # asked again at the next call
        self._role_asked_at = now
        self._master = status.replication.role != SLAVE_ROLE
        return self._master

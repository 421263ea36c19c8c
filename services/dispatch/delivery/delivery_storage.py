"""The timer's calls to the storage it follows, beside the dispatch's StorageClient (whose
``append_run`` the shared re-put uses): Read of whole records (decoded here, as the re-put
wants them), SaveDeliveryProgress (the timer checkpoint, for the slaves: decision 2 of
issue 18) and the storage's role (the timer delivers only beside a master).

A channel of its own, apart from the dispatch's reads: the timer's reads of a slot never
queue behind a pull's Read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import grpc

from services.dispatch.storage_client import CHANNEL_OPTIONS, READ_MAX_BYTES
from tide.format import DecodedRecord, decode_record
from tide.limits import READ_MAX_POSITIONS
from tide.server import traced_channel
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

log = logging.getLogger("tide.dispatch.delivery")
APPEND_TIMEOUT_S = 30.0  # a sync flush, or a SYNC_MASTER waiting for its slave
PROGRESS_TIMEOUT_S = 5.0
ROLE_TIMEOUT_S = 5.0
# The role is asked again this often (and at each failure of an Append).
ROLE_REFRESH_S = 1.0
# SaveDeliveryProgress outcomes that mean "this storage cannot keep it now": logged once.
_PROGRESS_TOLERATED = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE)
SLAVE_ROLE = "SLAVE"


class DeliveryStorage:
    def __init__(self, target: str) -> None:
        self.target = target
        self._channel = traced_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.StorageStub(self._channel)
        self._progress_warned: set[grpc.StatusCode] = set()
        self._master = False
        self._role_asked_at = float("-inf")

    async def close(self) -> None:
        await self._channel.close(None)

    async def read_records(
        self, positions: Sequence[tuple[int, int]]
    ) -> list[DecodedRecord | None]:
        """The records at (physical offset, size), decoded here from the bytes the storage
        reads (one span each; None: the storage no longer has it). Raises AioRpcError."""
        records: list[DecodedRecord | None] = []
        for part in _split(positions):
            request = pb.ReadRequest(
                spans=[pb.RecordSpan(physical_offset=o, size=s, count=1) for o, s in part]
            )
            response: pb.ReadResponse = await self._stub.Read(request, timeout=APPEND_TIMEOUT_S)
            if len(response.span_statuses) != len(part):
                raise RuntimeError(
                    f"storage {self.target} answered {len(response.span_statuses)} statuses "
                    f"for {len(part)} spans"
                )
            data, pos = response.records, 0
            for (offset, size), status in zip(part, response.span_statuses, strict=True):
                if status != pb.FOUND:
                    records.append(None)
                    continue
                records.append(decode_record(data, pos, pos + size, expected_offset=offset))
                pos += size
        return records

    async def read(self, positions: Sequence[tuple[int, int]]) -> list[pb.ReadResult]:
        """Read every (physical offset, size), in order, in as many calls as the storage's
        limits need; raises grpc.aio.AioRpcError."""
        results: list[pb.ReadResult] = []
        for part in _split(positions):
            request = pb.ReadRequest(
                positions=[pb.ReadRequest.Position(physical_offset=o, size=s) for o, s in part]
            )
            response: pb.ReadResponse = await self._stub.Read(request, timeout=APPEND_TIMEOUT_S)
            if len(response.results) != len(part):
                raise RuntimeError(
                    f"storage {self.target} answered {len(response.results)} results "
                    f"for {len(part)} positions"
                )
            results.extend(response.results)
        return results

    async def save_progress(
        self, *, timer_checkpoint: bytes = b"", delay_offsets_json: bytes = b""
    ) -> bool:
        """Copy progress to the storage; False when it did not take it (UNIMPLEMENTED or
        UNAVAILABLE are logged once each and tolerated: the local copy is what counts)."""
        request = pb.SaveDeliveryProgressRequest(
            timer_checkpoint=timer_checkpoint, delay_offsets_json=delay_offsets_json
        )
        try:
            await self._stub.SaveDeliveryProgress(request, timeout=PROGRESS_TIMEOUT_S)
            return True
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code not in self._progress_warned:
                self._progress_warned.add(code)
                level = logging.INFO if code in _PROGRESS_TOLERATED else logging.WARNING
                log.log(
                    level,
                    "storage %s did not keep the delivery progress (%s: %s); kept locally, "
                    "copied again at the next save (logged once)",
                    self.target,
                    code.name,
                    exc.details(),
                )
            return False

    async def is_master(self) -> bool:
        """Whether the storage is a master, asked at most every ROLE_REFRESH_S (the last
        answer while it does not answer; False before any)."""
        now = time.monotonic()
        if now - self._role_asked_at < ROLE_REFRESH_S:
            return self._master
        self._role_asked_at = now
        try:
            status: pb.StorageStatus = await self._stub.GetStatus(
                pb.GetStatusRequest(), timeout=ROLE_TIMEOUT_S
            )
        except grpc.aio.AioRpcError:
            return self._master
        self._master = status.replication.role != SLAVE_ROLE
        return self._master

    @property
    def master(self) -> bool:
        """The last answer of :meth:`is_master` (for status reports)."""
        return self._master


def _split(positions: Sequence[tuple[int, int]]) -> list[Sequence[tuple[int, int]]]:
    """Runs of positions within one Read's limits (READ_MAX_POSITIONS, READ_MAX_BYTES)."""
    parts: list[Sequence[tuple[int, int]]] = []
    start = total = 0
    for index, (_, size) in enumerate(positions):
        if index > start and (index - start >= READ_MAX_POSITIONS or total + size > READ_MAX_BYTES):
            parts.append(positions[start:index])
            start, total = index, 0
        total += size
    if start < len(positions):
        parts.append(positions[start:])
    return parts

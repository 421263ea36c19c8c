"""A slave started on an empty store begins at its master's min offset.

Before the store opens, an empty commitlog directory gets an empty segment named after
the master's first segment (retention may have deleted the head), so the slave's files
match the master's names from the first byte. Bounded: a few short GetStatus tries; a
master that does not answer leaves the slave starting at offset 0, and the handshake
explains what to do if the master no longer holds offset 0.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc

from services.storage.engine.segment_files import create_segment
from tide.format import parse_segment_name
from tide.server import cluster_channel_interceptors
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

log = logging.getLogger("tide.storage.replication.fresh_slave")
TRIES = 3
TRY_TIMEOUT_S = 2.0
RETRY_S = 0.5


def _is_empty(commitlog_dir: Path) -> bool:
    if not commitlog_dir.is_dir():
        return True
    return not any(parse_segment_name(path.name) is not None for path in commitlog_dir.iterdir())


async def _master_status(master: str) -> pb.StorageStatus | None:
    async with grpc.aio.insecure_channel(
        master, interceptors=cluster_channel_interceptors() or None
    ) as channel:
        stub = pb_grpc.StorageStub(channel)
        for attempt in range(1, TRIES + 1):
            try:
                status: pb.StorageStatus = await stub.GetStatus(
                    pb.GetStatusRequest(), timeout=TRY_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "master %s did not answer GetStatus (try %d of %d): %s: %s",
                    master,
                    attempt,
                    TRIES,
                    exc.code().name,
                    exc.details(),
                )
                await asyncio.sleep(RETRY_S)
                continue
            return status
    return None


async def prepare_fresh_slave(commitlog_dir: Path, segment_size_bytes: int, master: str) -> None:
    if not _is_empty(commitlog_dir):
        return
    status = await _master_status(master)
    if status is None:
        log.warning("starting the empty slave at offset 0: master %s did not answer", master)
        return
    if status.segment_size_bytes != segment_size_bytes or status.min_offset <= 0:
        return  # a size mismatch is refused by the master's handshake, with the fix
    commitlog_dir.mkdir(parents=True, exist_ok=True)
    segment = create_segment(
        commitlog_dir, status.min_offset, segment_size_bytes, preallocate=False, warm=False
    )
    segment.close()
    log.info(
        "empty slave: starting at the master's min offset %d (segment %s)",
        status.min_offset,
        segment.path.name,
    )

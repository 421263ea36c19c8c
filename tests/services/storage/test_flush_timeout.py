"""SYNC_FLUSH past its timeout answers FLUSH_DISK_TIMEOUT (the messages are written).

A slow disk cannot be made on demand here, so the real store's flush is held up by
holding the segment's flush lock; the service, the store and gRPC are the real ones
(served in-process so the test can reach the segment).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from services.storage.options import OPTIONS
from services.storage.service import StorageService
from tide.server import load_config, serve
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

TIMEOUT_MS = 300


async def _scenario(store_dir: Path) -> list[pb.AppendResponse]:
    argv = [
        "--store-dir",
        str(store_dir),
        "--flush",
        "sync",
        "--sync-flush-timeout-ms",
        str(TIMEOUT_MS),
        "--segment-size-bytes",
        str(1 << 20),
        "--max-message-body-bytes",
        "65536",
    ]
    service = StorageService(load_config("storage", OPTIONS, argv))
    stop = asyncio.Event()
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(
            service,
            "127.0.0.1:0",
            shutdown_grace_s=5,
            stop_event=stop,
            handle_signals=False,
            ready_callback=ready.set_result,
        )
    )
    endpoint = await asyncio.wait_for(ready, 30)
    request = pb.AppendRequest(messages=[pb.Message(topic="SlowDisk", body=b"x" * 100)])
    replies = []
    try:
        async with grpc.aio.insecure_channel(endpoint) as channel:
            stub = pb_grpc.StorageStub(channel)
            replies.append(await stub.Append(request))  # creates the segment, flushes
            segment = service._store_or_fail().segments.segments[-1]
            with segment._flush_lock:  # the "disk" cannot finish a sync now
                replies.append(await stub.Append(request))
            replies.append(await stub.Append(request))
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    return replies


def test_sync_flush_timeout_status(tmp_path: Path) -> None:
    first, slow, after = asyncio.run(_scenario(tmp_path / "store"))
    assert first.results[0].status == pb.PUT_OK
    assert slow.results[0].status == pb.FLUSH_DISK_TIMEOUT
    assert slow.results[0].physical_offset > first.results[0].physical_offset
    assert after.results[0].status == pb.PUT_OK
    assert after.results[0].queue_offset == slow.results[0].queue_offset + 1

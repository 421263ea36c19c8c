"""The transaction service's append stream (storage_io.py's RunAppendStream) across a
storage restart and an outage, against real storage processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from services.dispatch.storage_client import StorageClient
from services.dispatch.transaction import storage_io
from services.dispatch.transaction.storage_io import RunAppendStream
from tests._service_process import free_port
from tests.services.dispatch.delivery.test_progress import Launchers
from tide.format import RunWriter
from tide.server import ServiceError

BORN = bytes([10, 0, 0, 1, 0, 0, 0x13, 0x88])
TOPIC = "T_storage_io"
WAIT_S = 10.0  # generous: the first reconnect backoff is ~1 s


def one_run(body: bytes) -> bytes:
    writer = RunWriter(BORN)
    writer.add(TOPIC, TOPIC.encode(), 0, body, b"", 0, 0, 1_700_000_000_000)
    return writer.getvalue()


def test_a_resolution_right_after_a_storage_restart_is_appended(
    launchers: Launchers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The channel may still wait out its reconnect backoff when the storage is back: the
    new stream waits for it to connect instead of failing at once."""
    launcher = launchers[0]
    listen = ("--listen", f"127.0.0.1:{free_port()}")
    storage = launcher.start(tmp_path / "store", *listen)

    async def run() -> list[int]:
        client = StorageClient(storage.listen)
        appends = RunAppendStream(client)
        try:
            await client.upsert_topic(TOPIC, 1, 6)
            first = await appends.append_run(one_run(b"before"), 1)
            await asyncio.to_thread(storage.kill)
            # An append while it is down fails, and leaves the channel backing off.
            monkeypatch.setattr(storage_io, "CONNECT_WAIT_S", 0.2)
            with pytest.raises(ServiceError) as down:
                await appends.append_run(one_run(b"down"), 1)
            assert down.value.code is grpc.StatusCode.UNAVAILABLE
            monkeypatch.setattr(storage_io, "CONNECT_WAIT_S", WAIT_S)
            await asyncio.to_thread(launcher.start, tmp_path / "store", *listen)
            second = await appends.append_run(one_run(b"after"), 1)
            return [*first.physical_offsets, *second.physical_offsets]
        finally:
            appends.close()
            await client.close()

    first, second = asyncio.run(run())
    assert second > first


def test_a_storage_that_stays_down_is_unavailable_after_the_wait(
    launchers: Launchers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage_io, "CONNECT_WAIT_S", 0.3)
    del launchers, tmp_path  # nothing listens on the port

    async def run() -> ServiceError:
        client = StorageClient(f"127.0.0.1:{free_port()}")
        appends = RunAppendStream(client)
        try:
            with pytest.raises(ServiceError) as caught:
                await appends.append_run(one_run(b"never"), 1)
            return caught.value
        finally:
            appends.close()
            await client.close()

    error = asyncio.run(run())
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert error.message == "storage: not connected within 0.3 s; retry"

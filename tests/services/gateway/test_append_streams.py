"""The gateway's appends over AppendStream (services/gateway/append_streams.py) against a
real storage process: streams are reused and bounded, in-band errors raise what the unary
Append raises, a stopped storage gives DEADLINE_EXCEEDED, a killed one UNAVAILABLE, and
appends recover once it is back; a sampled trace uses the unary Append."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from services.gateway.append_queue import SMALL_APPENDS_IN_FLIGHT
from services.gateway.brokers import BrokerChannels
from tests._service_process import free_port
from tests.services.storage.conftest import StorageLauncher, StorageProcess
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until_async

TIMEOUT_S = 1.0
# An append to a storage just restarted: its first answer may take longer than TIMEOUT_S on
# a loaded box (the channel reconnecting, the process warming up); recovery is the point.
RECOVERY_TIMEOUT_S = 10.0


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[StorageLauncher]:
    launcher = StorageLauncher(tmp_path / "procs")
    try:
        yield launcher
    finally:
        launcher.close()


def start_storage(launcher: StorageLauncher, store: Path, port: int) -> StorageProcess:
    return launcher.start(store, "--listen", f"127.0.0.1:{port}")


def request(topic: str, body: bytes = b"x", count: int = 1) -> bytes:
    message = pb.Message(topic=topic, body=body)
    return pb.AppendRequest(messages=[message] * count).SerializeToString()


async def append(
    channels: BrokerChannels, address: str, data: bytes, timeout_s: float = TIMEOUT_S
) -> pb.AppendResult:
    """The result of the request's one message (coalesced calls answer several)."""
    outcome = await channels.appends(address).append(data, 1, timeout_s)
    return outcome.response.results[outcome.start]


def streams_logged(storage: StorageProcess) -> int:
    """The AppendStream streams the storage logged as opened."""
    return sum(
        "append stream from" in line and line.endswith(" opened")
        for line in storage.stderr().splitlines()
    )


def opened(channels: BrokerChannels, address: str) -> int:
    pool = channels.append_streams(address)
    return pool.opened if pool is not None else 0


def test_streams_are_reused_and_bounded(launcher: StorageLauncher, tmp_path: Path) -> None:
    storage = start_storage(launcher, tmp_path / "store", free_port())
    opened_streams = asyncio.run(_streams_are_reused_and_bounded(storage.listen))
    assert streams_logged(storage) == opened_streams


async def _streams_are_reused_and_bounded(address: str) -> int:
    channels = BrokerChannels(appends_in_flight=2)
    try:
        for index in range(20):
            response = await append(channels, address, request("T_reuse"))
            assert response.queue_offset == index
        assert opened(channels, address) == 1  # one call at a time: one stream
        responses = await asyncio.gather(
            *(append(channels, address, request("T_reuse")) for _ in range(50))
        )
        offsets = sorted(r.queue_offset for r in responses)
        assert offsets == list(range(20, 70))
        # appends_in_flight, and the slots of lone single-message groups (append_queue.py)
        assert 2 <= opened(channels, address) <= 2 + SMALL_APPENDS_IN_FLIGHT
        return opened(channels, address)
    finally:
        await channels.close()


def test_in_band_errors_raise_what_append_raises(launcher: StorageLauncher, tmp_path: Path) -> None:
    storage = start_storage(launcher, tmp_path / "store", free_port())
    asyncio.run(_in_band_errors_raise_what_append_raises(storage))


async def _in_band_errors_raise_what_append_raises(storage: StorageProcess) -> None:
    channels = BrokerChannels()
    address = storage.listen
    try:
        await append(channels, address, request("T_errors"))
        for bad in (request("bad topic!"), request("T_errors", b"x" * 70_000)):
            with pytest.raises(grpc.aio.AioRpcError) as streamed:
                await append(channels, address, bad)
            with pytest.raises(grpc.RpcError) as unary:
                storage.stub.Append(pb.AppendRequest.FromString(bad), timeout=20)
            assert isinstance(unary.value, grpc.Call)
            assert streamed.value.code() is unary.value.code()
            assert streamed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert streamed.value.details() == unary.value.details()
            assert streamed.value.details()
        response = await append(channels, address, request("T_errors"))
        assert response.queue_offset == 1
        assert opened(channels, address) == 1  # the same stream went on
    finally:
        await channels.close()


def test_a_stopped_storage_gives_deadline_exceeded(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    storage = start_storage(launcher, tmp_path / "store", free_port())
    asyncio.run(_a_stopped_storage_gives_deadline_exceeded(storage))


async def _a_stopped_storage_gives_deadline_exceeded(storage: StorageProcess) -> None:
    channels = BrokerChannels()
    address = storage.listen
    try:
        await append(channels, address, request("T_stopped"))
        storage.proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await append(channels, address, request("T_stopped"))
            assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - started < TIMEOUT_S + 1
        finally:
            storage.proc.send_signal(signal.SIGCONT)
        response = await append(channels, address, request("T_stopped"))
        assert response.physical_offset > 0
        assert opened(channels, address) == 2  # the timed-out stream was dropped
    finally:
        await channels.close()


def test_a_killed_storage_gives_unavailable_and_appends_recover(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    port = free_port()
    storage = start_storage(launcher, tmp_path / "store", port)
    asyncio.run(_killed_storage(launcher, storage, tmp_path / "store", port))


async def _killed_storage(
    launcher: StorageLauncher, storage: StorageProcess, store: Path, port: int
) -> None:
    channels = BrokerChannels()
    address = storage.listen
    try:
        await append(channels, address, request("T_killed"))
        storage.kill()
        for _ in range(3):  # the broken stream, then new ones the storage refuses
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await append(channels, address, request("T_killed"))
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE, info.value
            assert time.monotonic() - started < TIMEOUT_S + 1
        await asyncio.to_thread(start_storage, launcher, store, port)
        offsets: list[int] = []

        async def appended() -> bool:
            try:
                response = await append(channels, address, request("T_killed"), RECOVERY_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() is grpc.StatusCode.UNAVAILABLE, exc
                return False
            offsets.append(response.queue_offset)
            return True

        await wait_until_async(
            appended, "appends to recover", 3 * RECOVERY_TIMEOUT_S, interval_s=0.1
        )
        assert offsets == [1]
    finally:
        await channels.close()


def test_a_sampled_trace_uses_the_unary_append(launcher: StorageLauncher, tmp_path: Path) -> None:
    storage = start_storage(launcher, tmp_path / "store", free_port())
    asyncio.run(_a_sampled_trace_uses_the_unary_append(storage.listen))
    assert streams_logged(storage) == 0


async def _a_sampled_trace_uses_the_unary_append(address: str) -> None:
    span = TracerProvider().get_tracer("test").start_span("produce")
    assert span.is_recording()
    channels = BrokerChannels()
    try:
        with trace.use_span(span, end_on_exit=True):
            response = await append(channels, address, request("T_traced"))
        assert response.queue_offset == 0
        assert opened(channels, address) == 0
    finally:
        await channels.close()


def test_after_a_graceful_restart_the_ended_stream_is_not_reused(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    port = free_port()
    storage = start_storage(launcher, tmp_path / "store", port)
    asyncio.run(_graceful_restart(launcher, storage, tmp_path / "store", port))


async def _graceful_restart(
    launcher: StorageLauncher, storage: StorageProcess, store: Path, port: int
) -> None:
    channels = BrokerChannels()
    address = storage.listen
    try:
        await append(channels, address, request("T_restarted"))
        await asyncio.to_thread(storage.stop)  # SIGTERM: the idle stream ends (status OK)
        assert "ended after 1 appends" in storage.stderr()
        await asyncio.to_thread(start_storage, launcher, store, port)
        await wait_until_async(
            lambda: channels.connected(address), "the channel to reconnect", 10, interval_s=0.05
        )
        response = await append(channels, address, request("T_restarted"))  # no error
        assert response.queue_offset == 1
        assert opened(channels, address) == 2
    finally:
        await channels.close()

"""Open streams are bounded (each holds a message or a chunk at a time, so their number
bounds their memory): a real storage process refuses the Tail stream past
MAX_TAIL_STREAMS and the AppendStream past MAX_REQUEST_STREAMS with RESOURCE_EXHAUSTED
naming the limit, and takes new ones once others closed."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from services.storage.servicer import MAX_TAIL_STREAMS
from tests.services.storage.conftest import RPC_TIMEOUT_S, StorageProcess, message
from tide.server._request_streams import MAX_REQUEST_STREAMS
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc
from tide.waiting import wait_until_async

STREAMS_PER_CHANNEL = 64  # below HTTP/2's usual cap on concurrent streams per connection


async def open_until_refused(
    storage: StorageProcess, limit: int, open_one: Any, confirm: Any, refusal: Any = None
) -> tuple[grpc.aio.AioRpcError, list[Any], list[Any]]:
    """Open ``limit`` streams (each confirmed open by the server), then one more: its
    error (``refusal(call)`` when given, else what ``confirm`` raises), the open calls
    and the channels."""
    channels = [
        grpc.aio.insecure_channel(storage.listen) for _ in range(limit // STREAMS_PER_CHANNEL + 2)
    ]
    calls = []
    for index in range(limit):
        call = open_one(pb_grpc.StorageStub(channels[index // STREAMS_PER_CHANNEL]))
        calls.append(call)
    await asyncio.gather(*(confirm(call) for call in calls))
    extra = open_one(pb_grpc.StorageStub(channels[-1]))
    if refusal is not None:
        return await refusal(extra), calls, channels
    try:
        await confirm(extra)
    except grpc.aio.AioRpcError as exc:
        return exc, calls, channels
    raise AssertionError(f"stream {limit + 1} was not refused")


async def close_all(calls: list[Any], channels: list[Any]) -> None:
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()


def test_tail_streams_past_the_limit_are_refused(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    shared_storage.append([message(topic_name, 0, b"x")])

    def open_one(stub: Any) -> Any:
        return stub.Tail(pb.TailRequest(offset=0), timeout=RPC_TIMEOUT_S * 3)

    async def confirm(call: Any) -> None:
        chunk = await call.read()  # the first chunk: the server's handler runs
        assert isinstance(chunk, pb.TailChunk), chunk

    async def run() -> None:
        error, calls, channels = await open_until_refused(
            shared_storage, MAX_TAIL_STREAMS, open_one, confirm
        )
        try:
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"{MAX_TAIL_STREAMS} Tail streams are open" in (error.details() or "")
            assert "MAX_TAIL_STREAMS" in (error.details() or "")
            calls.pop().cancel()  # one closes: a new one is taken (once the server saw it)
            async with grpc.aio.insecure_channel(shared_storage.listen) as channel:

                async def taken() -> bool:
                    call = open_one(pb_grpc.StorageStub(channel))
                    try:
                        await confirm(call)
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                        return False
                    call.cancel()
                    return True

                await wait_until_async(
                    taken, "a Tail stream taken once one closed", RPC_TIMEOUT_S, interval_s=0.05
                )
        finally:
            await close_all(calls, channels)

    asyncio.run(run())


async def _status_error(call: Any) -> grpc.aio.AioRpcError:
    """The stream's own status as an error (a stream-stream call is not awaitable)."""
    return grpc.aio.AioRpcError(
        await call.code(),
        await call.initial_metadata(),
        await call.trailing_metadata(),
        await call.details(),
        await call.debug_error_string(),
    )


def test_append_streams_past_the_limit_are_refused(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    def open_one(stub: Any) -> Any:
        return stub.AppendStream(None, timeout=RPC_TIMEOUT_S * 3)

    async def confirm(call: Any) -> None:
        await call.write(pb.AppendRequest(messages=[message(topic_name, 0, b"a")]))
        answer = await call.read()  # answered: the server's handler runs
        assert answer is not grpc.aio.EOF, await call.details()  # type: ignore[attr-defined]
        assert answer.error_code == 0, answer.error_message

    async def refused(call: Any) -> grpc.aio.AioRpcError:
        # The server refuses a stream as its handler starts, before reading a request,
        # so the extra stream is not written to: a write racing the refusal fails with
        # grpc.aio's own INTERNAL, which then replaces the server's status on the call.
        code = await call.code()  # (the call's deadline bounds the wait)
        assert code is not grpc.StatusCode.OK, "the extra stream was not refused"
        return await _status_error(call)

    async def run() -> None:
        error, calls, channels = await open_until_refused(
            shared_storage, MAX_REQUEST_STREAMS, open_one, confirm, refused
        )
        try:
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            details = error.details() or ""
            assert f"{MAX_REQUEST_STREAMS} append streams are open" in details
            assert "MAX_REQUEST_STREAMS" in details
        finally:
            await close_all(calls, channels)

    asyncio.run(run())

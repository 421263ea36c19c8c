"""The cluster secret rides as call metadata on a :class:`SecretChannel` (not as client
interceptors, which cost grpc.aio a task and a wait per streamed request): every kind of
call carries it, a caller's own metadata stays, and a channel without it is refused.
The processes' links with the secret: tests/auth/test_cluster_secret.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from tide.server import _cluster_secret as cluster_secret
from tide.server._cluster_secret import (
    METADATA_KEY,
    ClusterSecretInterceptor,
    SecretChannel,
    cluster_channel,
)
from tide.server._event_loop import run_on

SECRET = "secret-for-the-channel-tests-0123"
SERVICE = "tests.SecretEcho"


def _same(message: bytes) -> bytes:
    return message


def _seen(context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    """The application's metadata keys the server saw (``x-``), sorted and joined."""
    keys = sorted(key for key, _ in context.invocation_metadata() or () if key.startswith("x-"))
    return ",".join(keys).encode()


async def _unary(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    return _seen(context)


async def _server_stream(
    request: bytes, context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[bytes]:
    yield _seen(context)


async def _bidi(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request + b"|" + _seen(context)


@pytest.fixture
def secret() -> Iterator[str]:
    before = cluster_secret.SECRET.value
    cluster_secret.SECRET.value = SECRET
    try:
        yield SECRET
    finally:
        cluster_secret.SECRET.value = before


@asynccontextmanager
async def _serving() -> AsyncIterator[str]:
    """The test service's address, behind the secret's check, while the block runs."""
    server = grpc.aio.server(interceptors=[ClusterSecretInterceptor()])
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(_unary, _same, _same),
        "ServerStream": grpc.unary_stream_rpc_method_handler(_server_stream, _same, _same),
        "Bidi": grpc.stream_stream_rpc_method_handler(_bidi, _same, _same),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def test_without_a_secret_the_channel_is_left_as_it_is() -> None:
    async def check() -> None:
        assert cluster_secret.SECRET.value is None
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        assert cluster_channel(channel) is channel
        await channel.close(None)

    run_on("asyncio", check())


def test_every_kind_of_call_carries_the_secret(secret: str) -> None:
    async def check() -> None:
        async with _serving() as address:
            channel = cluster_channel(grpc.aio.insecure_channel(address))
            assert isinstance(channel, SecretChannel)
            async with channel:
                unary = channel.unary_unary(f"/{SERVICE}/Unary", _same, _same)
                assert await unary(b"") == METADATA_KEY.encode()
                # a caller's own metadata stays beside the secret
                both = await unary(b"", metadata=(("x-caller", "1"),))
                assert both == f"x-caller,{METADATA_KEY}".encode()
                stream = channel.unary_stream(f"/{SERVICE}/ServerStream", _same, _same)
                assert [answer async for answer in stream(b"")] == [METADATA_KEY.encode()]
                bidi = channel.stream_stream(f"/{SERVICE}/Bidi", _same, _same)()
                # written one by one, as the gateway's request streams write: no
                # interceptor between the call and its writes
                assert "Intercepted" not in type(bidi).__name__
                for number in range(3):
                    await bidi.write(b"%d" % number)
                    assert await bidi.read() == b"%d|%s" % (number, METADATA_KEY.encode())
                await bidi.done_writing()

    run_on("asyncio", check())


def test_a_channel_without_the_secret_is_refused(secret: str) -> None:
    async def check() -> None:
        async with _serving() as address, grpc.aio.insecure_channel(address) as channel:
            unary = channel.unary_unary(f"/{SERVICE}/Unary", _same, _same)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await unary(b"")
            assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED

    run_on("asyncio", check())

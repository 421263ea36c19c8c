"""serve() in-process: stop_event instead of signals, ready_callback, listen errors."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest

from tests.server._echo_service import NAME, OPTIONS, EchoService
from tide.server import ListenError, load_config, parse_listen, serve


def echo_service(tmp_path: Path) -> EchoService:
    marker = tmp_path / "stopped"
    argv = ["--start-delay-ms", "0", "--stop-marker-path", str(marker)]
    return EchoService(load_config("echo", OPTIONS, argv))


async def serve_echo_once(service: EchoService) -> tuple[str, bytes]:
    stop = asyncio.Event()
    endpoints: list[str] = []
    ready = asyncio.Event()

    def on_ready(endpoint: str) -> None:
        endpoints.append(endpoint)
        ready.set()

    task = asyncio.create_task(
        serve(
            service,
            "127.0.0.1:0",
            shutdown_grace_s=5,
            ready_callback=on_ready,
            stop_event=stop,
            handle_signals=False,
        )
    )
    await asyncio.wait_for(ready.wait(), timeout=30)
    async with grpc.aio.insecure_channel(endpoints[0]) as chan:
        reply: bytes = await chan.unary_unary(f"/{NAME}/Echo", None, None)(b"in-process")
    stop.set()
    await asyncio.wait_for(task, timeout=30)
    return endpoints[0], reply


def test_serve_until_stop_event(tmp_path: Path) -> None:
    endpoint, reply = asyncio.run(serve_echo_once(echo_service(tmp_path)))
    assert reply == b"in-process"
    assert parse_listen(endpoint)[1] > 0
    assert (tmp_path / "stopped").read_text(encoding="utf-8") == "stopped\n"


def test_serve_reports_a_busy_port(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        run = serve(echo_service(tmp_path), f"127.0.0.1:{port}", shutdown_grace_s=1)
        with pytest.raises(ListenError, match=f"cannot listen on 127.0.0.1:{port}: address in use"):
            asyncio.run(run)
    assert not (tmp_path / "stopped").exists()


@pytest.mark.parametrize("listen", ["localhost", ":80", "host:", "host:99999", "host:http"])
def test_parse_listen_rejects_malformed_values(listen: str) -> None:
    with pytest.raises(ListenError, match="expected HOST:PORT"):
        parse_listen(listen)


def test_parse_listen_accepts_ipv6() -> None:
    assert parse_listen("[::1]:10911") == ("[::1]", 10911)

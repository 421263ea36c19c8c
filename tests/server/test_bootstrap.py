"""The gRPC runner, exercised on a real subprocess running tests/server/_echo_service.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests._ports import free_port
from tide.spawn import spawn, wait_ready
from tide.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
ECHO = "tide.v1.TestEcho"
TIMEOUT_S = 30.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class EchoProcess:
    proc: subprocess.Popen[bytes]
    workdir: Path

    @property
    def ready_file(self) -> Path:
        return self.workdir / "ready.json"

    @property
    def stop_marker(self) -> Path:
        return self.workdir / "stopped"

    def stderr(self) -> str:
        return (self.workdir / "stderr.log").read_text(encoding="utf-8", errors="replace")

    def stdout(self) -> str:
        return (self.workdir / "stdout.log").read_text(encoding="utf-8", errors="replace")

    def wait_ready(self) -> dict[str, Any]:
        return wait_ready(
            self.proc,
            self.ready_file,
            "echo service",
            TIMEOUT_S,
            stderr_path=self.workdir / "stderr.log",
        )

    def wait_exit(self) -> int:
        try:
            return self.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"echo service did not exit; stderr:\n{self.stderr()}")


def wait_for(check: Callable[[], bool], echo: EchoProcess, what: str) -> None:
    """Poll ``check`` until it holds; fail early if the process exits."""

    def done() -> bool:
        if echo.proc.poll() is not None:
            pytest.fail(
                f"echo service exited ({echo.proc.returncode}) before {what}:\n{echo.stderr()}"
            )
        return check()

    wait_until(done, what, TIMEOUT_S, state=lambda: f"stderr:\n{echo.stderr()}")


def launch(workdir: Path, *args: str, env_extra: dict[str, str] | None = None) -> EchoProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    env.update(env_extra or {})
    env["TIDE_ECHO_STOP_MARKER_PATH"] = str(workdir / "stopped")
    with (workdir / "stdout.log").open("wb") as out, (workdir / "stderr.log").open("wb") as err:
        proc = spawn(
            [sys.executable, "-m", "tests.server._echo_service", *args],
            workdir / "ready.json",
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=err,
        )
    return EchoProcess(proc, workdir)


def stop(echo: EchoProcess) -> None:
    if echo.proc.poll() is None:
        echo.proc.kill()
        echo.proc.wait(timeout=TIMEOUT_S)


@pytest.fixture
def start_echo(tmp_path: Path) -> Iterator[Callable[..., EchoProcess]]:
    started: list[EchoProcess] = []

    def start(*args: str, env_extra: dict[str, str] | None = None) -> EchoProcess:
        echo = launch(tmp_path / f"echo{len(started)}", *args, env_extra=env_extra)
        started.append(echo)
        return echo

    try:
        yield start
    finally:
        for echo in started:
            stop(echo)


@pytest.fixture(scope="module")
def shared_echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EchoProcess, str]]:
    """One running echo service for the tests that only make calls."""
    echo = launch(
        tmp_path_factory.mktemp("shared"), "--listen", "127.0.0.1:0", "--start-delay-ms", "0"
    )
    try:
        yield echo, echo.wait_ready()["listen"]
    finally:
        stop(echo)


@pytest.fixture
def channel(shared_echo: tuple[EchoProcess, str]) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(shared_echo[1]) as chan:
        yield chan


def unary(chan: grpc.Channel, method: str) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
    """A raw-bytes callable for an echo method (no protobuf serialization)."""
    return chan.unary_unary(f"/{ECHO}/{method}", None, None)


def call(chan: grpc.Channel, method: str, request: bytes) -> bytes:
    response: bytes = unary(chan, method)(request, timeout=TIMEOUT_S)
    return response


def rpc_error(run: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        run()
    return info.value


def health_status(chan: grpc.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(chan)
    response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S)
    status: int = response.status
    return status


# --- start-up -------------------------------------------------------------------------------


def test_ready_file_reports_the_ephemeral_port(shared_echo: tuple[EchoProcess, str]) -> None:
    echo, listen = shared_echo
    info = json.loads(echo.ready_file.read_text(encoding="utf-8"))
    host, _, port = listen.rpartition(":")
    assert host == "127.0.0.1"
    assert int(port) > 0
    assert info == {
        "service": "echo",
        "grpc_service": ECHO,
        "listen": listen,
        "event_loop": "uvloop",  # the default --event-loop
        "pid": echo.proc.pid,
    }
    assert f"listening on {listen} (event loop: uvloop)" in echo.stderr()


def test_event_loop_asyncio_on_request(start_echo: Callable[..., EchoProcess]) -> None:
    echo = start_echo("--listen", "127.0.0.1:0", "--start-delay-ms", "0", "--event-loop", "asyncio")
    info = echo.wait_ready()
    assert info["event_loop"] == "asyncio"
    assert "(event loop: asyncio)" in echo.stderr()
    with grpc.insecure_channel(info["listen"]) as chan:
        assert call(chan, "Echo", b"on asyncio") == b"on asyncio"


def test_uvloop_that_cannot_be_imported_falls_back_to_asyncio(
    start_echo: Callable[..., EchoProcess], tmp_path: Path
) -> None:
    shadow = tmp_path / "shadow" / "uvloop"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("uvloop broken for this test")\n')
    echo = start_echo(
        "--listen",
        "127.0.0.1:0",
        "--start-delay-ms",
        "0",
        env_extra={"PYTHONPATH": str(shadow.parent)},
    )
    info = echo.wait_ready()
    assert info["event_loop"] == "asyncio"
    assert (
        "--event-loop uvloop: cannot import uvloop (uvloop broken for this test); "
        "running on asyncio's loop" in echo.stderr()
    )
    with grpc.insecure_channel(info["listen"]) as chan:
        assert call(chan, "Echo", b"still serving") == b"still serving"


def test_unknown_event_loop_is_a_usage_error(start_echo: Callable[..., EchoProcess]) -> None:
    echo = start_echo("--listen", "127.0.0.1:0", "--event-loop", "trio")
    assert echo.wait_exit() == 2
    assert "--event-loop: expected one of uvloop, asyncio; got 'trio'" in echo.stderr()


def test_health_is_serving_for_overall_and_service(channel: grpc.Channel) -> None:
    assert health_status(channel, "") == SERVING
    assert health_status(channel, ECHO) == SERVING
    error = rpc_error(lambda: health_status(channel, "tide.v1.Unknown"))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_health_list_names_every_status(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    response = stub.List(health_pb2.HealthListRequest(), timeout=TIMEOUT_S)
    statuses = {name: entry.status for name, entry in response.statuses.items()}
    assert statuses == {"": SERVING, ECHO: SERVING}


def test_health_watch_streams_the_status(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    responses = stub.Watch(health_pb2.HealthCheckRequest(service=ECHO), timeout=TIMEOUT_S)
    try:
        assert next(responses).status == SERVING
    finally:
        responses.cancel()


def test_reflection_lists_the_services(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    responses = list(stub.ServerReflectionInfo(iter([request]), timeout=TIMEOUT_S))
    names = {svc.name for svc in responses[0].list_services_response.service}
    assert names == {ECHO, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}


def test_not_serving_until_start_completes(start_echo: Callable[..., EchoProcess]) -> None:
    port = free_port()
    echo = start_echo("--listen", f"127.0.0.1:{port}", "--start-delay-ms", "3000")
    wait_for(lambda: accepts_connections(port), echo, "the port to accept connections")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
        assert health_status(chan, "") == NOT_SERVING
        assert health_status(chan, ECHO) == NOT_SERVING
        error = rpc_error(lambda: call(chan, "Echo", b"early"))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert error.details() == f"{ECHO} is starting"
        assert not echo.ready_file.exists()
        echo.wait_ready()
        assert health_status(chan, ECHO) == SERVING
        assert call(chan, "Echo", b"late") == b"late"


def test_sigterm_while_starting_stops_at_once(start_echo: Callable[..., EchoProcess]) -> None:
    """A service still starting (waiting for a dependency) stops on the first signal:
    its start is cancelled; stop() is not called because start never finished."""
    port = free_port()
    echo = start_echo("--listen", f"127.0.0.1:{port}", "--start-delay-ms", "60000")
    wait_for(lambda: accepts_connections(port), echo, "the port to accept connections")
    began = time.monotonic()
    echo.proc.send_signal(signal.SIGTERM)
    assert echo.wait_exit() == 0
    assert time.monotonic() - began < 30
    assert not echo.ready_file.exists()
    assert not echo.stop_marker.exists()
    assert "stopped while starting" in echo.stderr()


def accepts_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


# --- errors ---------------------------------------------------------------------------------


def test_echo_round_trip(channel: grpc.Channel) -> None:
    assert call(channel, "Echo", b"hello") == b"hello"


@pytest.mark.parametrize(
    ("code", "message"),
    [(grpc.StatusCode.NOT_FOUND, "no topic orders"), (grpc.StatusCode.INVALID_ARGUMENT, "bad")],
)
def test_service_error_becomes_its_status(
    channel: grpc.Channel, code: grpc.StatusCode, message: str
) -> None:
    error = rpc_error(lambda: call(channel, "Fail", f"{code.name}:{message}".encode()))
    assert error.code() == code
    assert error.details() == message


def test_unexpected_exception_becomes_internal_and_is_logged(
    channel: grpc.Channel, shared_echo: tuple[EchoProcess, str]
) -> None:
    error = rpc_error(lambda: call(channel, "Crash", b"disk on fire"))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert error.details() == "RuntimeError: boom: disk on fire"
    stderr = shared_echo[0].stderr()
    assert f"unexpected error in /{ECHO}/Crash\nTraceback (most recent call last):" in stderr
    assert "RuntimeError: boom: disk on fire" in stderr


def read_stream(chan: grpc.Channel, request: bytes) -> tuple[list[bytes], grpc.RpcError | None]:
    received: list[bytes] = []
    try:
        for item in chan.unary_stream(f"/{ECHO}/Stream", None, None)(request, timeout=TIMEOUT_S):
            received.append(item)
    except grpc.RpcError as error:
        return received, error
    return received, None


def test_stream_ends_normally(channel: grpc.Channel) -> None:
    assert read_stream(channel, b"3") == ([b"0", b"1", b"2"], None)


def test_stream_service_error_after_some_items(channel: grpc.Channel) -> None:
    received, error = read_stream(channel, b"2:OUT_OF_RANGE:offset deleted")
    assert received == [b"0", b"1"]
    assert error is not None
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert error.details() == "offset deleted"


def test_stream_unexpected_exception_becomes_internal(channel: grpc.Channel) -> None:
    received, error = read_stream(channel, b"0:CRASH:torn")
    assert received == []
    assert error is not None
    assert error.code() == grpc.StatusCode.INTERNAL
    assert error.details() == "RuntimeError: stream boom: torn"


def test_unknown_method_is_unimplemented(channel: grpc.Channel) -> None:
    error = rpc_error(lambda: call(channel, "Nope", b""))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED


# --- listen errors --------------------------------------------------------------------------


def test_port_held_by_a_plain_socket(start_echo: Callable[..., EchoProcess]) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        echo = start_echo("--listen", f"127.0.0.1:{port}")
        assert echo.wait_exit() == 1
    assert f"cannot listen on 127.0.0.1:{port}: address in use" in echo.stderr()
    assert not echo.ready_file.exists()


def test_port_held_by_another_tide_server(
    start_echo: Callable[..., EchoProcess], shared_echo: tuple[EchoProcess, str]
) -> None:
    listen = shared_echo[1]
    echo = start_echo("--listen", listen)
    assert echo.wait_exit() == 1
    assert f"cannot listen on {listen}: address in use" in echo.stderr()


def test_malformed_listen_is_a_usage_error(start_echo: Callable[..., EchoProcess]) -> None:
    echo = start_echo("--listen", "localhost")
    assert echo.wait_exit() == 2
    assert "--listen: expected HOST:PORT, got 'localhost'" in echo.stderr()


# --- shutdown -------------------------------------------------------------------------------


def start_serving(start_echo: Callable[..., EchoProcess], *args: str) -> tuple[EchoProcess, str]:
    echo = start_echo("--listen", "127.0.0.1:0", "--start-delay-ms", "0", *args)
    return echo, echo.wait_ready()["listen"]


def test_sigterm_lets_in_flight_calls_finish_then_stops(
    start_echo: Callable[..., EchoProcess],
) -> None:
    echo, listen = start_serving(start_echo)
    with grpc.insecure_channel(listen) as chan:
        pending = unary(chan, "Slow").future(b"1.0", timeout=TIMEOUT_S)
        wait_for(lambda: "slow call started" in echo.stderr(), echo, "the slow call")
        echo.proc.send_signal(signal.SIGTERM)
        assert pending.result() == b"slept"
    assert echo.wait_exit() == 0
    assert echo.stop_marker.read_text(encoding="utf-8") == "stopped\n"
    stderr = echo.stderr()
    assert "SIGTERM: shutting down" in stderr
    assert stderr.index("server stopped; stopping") < stderr.index("tide.server: stopped")


def test_sigint_stops_cleanly(start_echo: Callable[..., EchoProcess]) -> None:
    echo, _ = start_serving(start_echo)
    echo.proc.send_signal(signal.SIGINT)
    assert echo.wait_exit() == 0
    assert echo.stop_marker.exists()
    assert "SIGINT: shutting down" in echo.stderr()


def test_grace_period_cancels_long_calls(start_echo: Callable[..., EchoProcess]) -> None:
    echo, listen = start_serving(start_echo, "--shutdown-grace-s", "0.5")
    with grpc.insecure_channel(listen) as chan:
        pending = unary(chan, "Slow").future(b"600", timeout=TIMEOUT_S)
        wait_for(lambda: "slow call started" in echo.stderr(), echo, "the slow call")
        started = time.monotonic()
        echo.proc.send_signal(signal.SIGTERM)
        assert echo.wait_exit() == 0
        assert time.monotonic() - started < 10
        assert pending.exception() is not None
    assert echo.stop_marker.exists()


def test_second_signal_exits_immediately(start_echo: Callable[..., EchoProcess]) -> None:
    echo, listen = start_serving(start_echo, "--shutdown-grace-s", "600")
    with grpc.insecure_channel(listen) as chan:
        pending = unary(chan, "Slow").future(b"600", timeout=TIMEOUT_S)
        wait_for(lambda: "slow call started" in echo.stderr(), echo, "the slow call")
        echo.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "in-flight calls have" in echo.stderr(), echo, "the shutdown to begin")
        echo.proc.send_signal(signal.SIGTERM)
        assert echo.wait_exit() == 128 + signal.SIGTERM
        assert pending.exception() is not None
    assert "SIGTERM during shutdown: exiting immediately" in echo.stderr()
    assert not echo.stop_marker.exists()


def test_console_traces_exporter_records_server_spans(
    start_echo: Callable[..., EchoProcess],
) -> None:
    echo, listen = start_serving(start_echo, "--otel-traces-exporter", "console")
    with grpc.insecure_channel(listen) as chan:
        assert call(chan, "Echo", b"traced") == b"traced"
        assert health_status(chan, "") == SERVING
    echo.proc.send_signal(signal.SIGTERM)
    assert echo.wait_exit() == 0
    out = echo.stdout()
    assert f'"name": "{ECHO}/Echo"' in out
    assert '"rpc.grpc.status_code": 0' in out
    assert '"service.name": "tide-echo"' in out
    assert "grpc.health" not in out


def test_health_watchers_do_not_hold_the_shutdown(
    start_echo: Callable[..., EchoProcess],
) -> None:
    echo, listen = start_serving(start_echo, "--shutdown-grace-s", "600")
    with grpc.insecure_channel(listen) as chan:
        stub = health_pb2_grpc.HealthStub(chan)
        responses = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S)
        assert next(responses).status == SERVING
        started = time.monotonic()
        echo.proc.send_signal(signal.SIGTERM)
        assert next(responses).status == NOT_SERVING
        error = rpc_error(lambda: next(responses))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert echo.wait_exit() == 0
        assert time.monotonic() - started < 10

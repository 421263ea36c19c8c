"""``tide up`` starts the local cluster (name server, brokers, gateway), prints the
endpoints, and stops it cleanly in order."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tide.cli import build_parser
from tide.cli._up import CONSOLE_MAIN, GATEWAY_MAIN, _check_args, _children
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import dispatch_pb2_grpc as dispatch_grpc
from tide.v1 import nameserver_pb2 as ns_pb
from tide.v1 import nameserver_pb2_grpc as ns_grpc
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc
from tide.waiting import wait_until

START_TIMEOUT_S = 60.0
RPC_TIMEOUT_S = 20.0
ANY_PORT = ("--namesrv-port", "0", "--storage-port", "0", "--dispatch-port", "0")


def up_command(root: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tide.cli",
        "up",
        "--store-dir",
        str(root),
        *extra,
        "--gateway-port",
        "0",
        # The web console on any free port (8080 may be taken on a shared machine).
        "--console-listen",
        "127.0.0.1:0",
        "--segment-size-bytes",
        str(8 << 20),
        "--log-level",
        "info",
    ]


@contextmanager
def running_up(command: list[str], stderr_path: Path) -> Iterator[subprocess.Popen[str]]:
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def read_endpoints(proc: subprocess.Popen[str], stderr_path: Path) -> dict[str, str]:
    """The endpoints table ``tide up`` prints once everything serves."""
    endpoints: dict[str, str] = {}
    deadline = time.monotonic() + START_TIMEOUT_S
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(
                f"tide up ended before printing endpoints (status {proc.poll()}):\n"
                + stderr_path.read_text()
            )
        if line.startswith("Ctrl-C stops the cluster"):
            return endpoints
        words = line.split()
        if len(words) == 2 and not line.startswith("Try"):
            endpoints[words[0]] = words[1]
    raise AssertionError("no endpoints within the deadline")


def console_page(endpoint: str, path: str, context: ssl.SSLContext | None = None) -> str:
    scheme = "https" if context is not None else "http"
    url = f"{scheme}://{endpoint}{path}"
    with urllib.request.urlopen(url, timeout=RPC_TIMEOUT_S, context=context) as answer:
        return str(answer.read().decode())


def serving(endpoint: str, service: str) -> bool:
    with grpc.insecure_channel(endpoint) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def cluster_members(namesrv: str) -> list[tuple[str, str, str]]:
    with grpc.insecure_channel(namesrv) as channel:
        info = ns_grpc.NameServerStub(channel).GetClusterInfo(
            ns_pb.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S
        )
    return [(b.broker_name, b.address.storage, b.address.dispatch) for b in info.brokers]


def append(storage: str, topic: str) -> None:
    with grpc.insecure_channel(storage) as channel:
        reply = pb_grpc.StorageStub(channel).Append(
            pb.AppendRequest(messages=[pb.Message(topic=topic, body=b"hi")]),
            timeout=RPC_TIMEOUT_S,
        )
    assert reply.results[0].status == pb.PUT_OK


def dispatched(dispatch: str, topic: str) -> bool:
    with grpc.insecure_channel(dispatch) as channel:
        request = dispatch_pb.GetQueueOffsetsRequest(topic=topic, queue_id=0)
        try:
            stub = dispatch_grpc.DispatchStub(channel)
            return stub.GetQueueOffsets(request, timeout=RPC_TIMEOUT_S).max_offset == 1
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            return False


def routed_brokers(namesrv: str, topic: str) -> list[str]:
    with grpc.insecure_channel(namesrv) as channel:
        try:
            route = ns_grpc.NameServerStub(channel).GetTopicRoute(
                ns_pb.GetTopicRouteRequest(topic=topic), timeout=RPC_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            return []
    return [q.broker_name for q in route.queue_datas]


def test_up_serves_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    root = tmp_path / "tide"
    stderr_path = tmp_path / "up.stderr"
    with running_up(up_command(root, *ANY_PORT), stderr_path) as proc:
        endpoints = read_endpoints(proc, stderr_path)
        expected = {"nameserver", "storage", "dispatch"} | (
            {"gateway", "console"} if GATEWAY_MAIN.exists() and CONSOLE_MAIN.exists() else set()
        )
        assert set(endpoints) == expected, endpoints
        for endpoint in endpoints.values():
            assert endpoint.startswith("127.0.0.1:") and not endpoint.endswith(":0")
        namesrv, storage, dispatch = (endpoints[n] for n in ("nameserver", "storage", "dispatch"))
        for name, service in (
            ("nameserver", "tide.v1.NameServer"),
            ("storage", "tide.v1.Storage"),
            ("dispatch", "tide.v1.Dispatch"),
            ("gateway", "tide.v1.Gateway"),
        ):
            if name in endpoints:
                assert serving(endpoints[name], service), name
        # The storage registered with the name server, advertising its dispatch.
        wait_until(
            lambda: cluster_members(namesrv) == [("broker-a", storage, dispatch)],
            "broker-a's registration",
            timeout_s=START_TIMEOUT_S,
        )
        append(storage, "UpTopic")
        wait_until(
            lambda: dispatched(dispatch, "UpTopic"),
            "the dispatch to see the message",
            timeout_s=START_TIMEOUT_S,
        )
        wait_until(
            lambda: routed_brokers(namesrv, "UpTopic") == ["broker-a"],
            "UpTopic's route",
            timeout_s=START_TIMEOUT_S,
        )
        assert (root / "store" / "abort").exists()  # open while running
        if "console" in endpoints:  # the web console, told the gateway
            assert console_page(endpoints["console"], "/healthz") == "ok\n"
            assert "broker-a" in console_page(endpoints["console"], "/cluster")
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0, stderr_path.read_text()
    log = stderr_path.read_text()
    assert not (root / "store" / "abort").exists(), "the store was not closed cleanly\n" + log
    assert (root / "store" / "commitlog" / "00000000000000000000").exists()
    assert (root / "store" / "consumequeue" / "UpTopic" / "0").is_dir()  # RocketMQ layout
    # The name server stops last: the storage could unregister from it.
    assert f"unregistered from name server {namesrv} (existed: True)" in log, log
    assert "stopped with status" not in log, log


def test_up_with_two_brokers(tmp_path: Path) -> None:
    root = tmp_path / "tide"
    stderr_path = tmp_path / "up.stderr"
    command = up_command(root, *ANY_PORT, "--brokers", "2", "--no-console")
    with running_up(command, stderr_path) as proc:
        endpoints = read_endpoints(proc, stderr_path)
        assert "console" not in endpoints
        pairs = [(endpoints[f"storage-{x}"], endpoints[f"dispatch-{x}"]) for x in "ab"]
        want = [("broker-a", *pairs[0]), ("broker-b", *pairs[1])]
        wait_until(
            lambda: cluster_members(endpoints["nameserver"]) == want,
            "both brokers",
            timeout_s=START_TIMEOUT_S,
        )
        append(pairs[1][0], "OnB")
        wait_until(
            lambda: dispatched(pairs[1][1], "OnB"), "broker-b's dispatch", timeout_s=START_TIMEOUT_S
        )
        assert routed_brokers(endpoints["nameserver"], "OnB") == ["broker-b"]
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, stderr_path.read_text()
    for broker in ("broker-a", "broker-b"):
        assert (root / broker / "commitlog").is_dir()
        assert not (root / broker / "abort").exists(), broker
    assert (root / "broker-b" / "consumequeue" / "OnB").is_dir()
    assert not (root / "store").exists()


def test_up_fails_fast_when_the_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        cmd = up_command(tmp_path / "t", *ANY_PORT, "--storage-port", str(port))
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert "storage exited with status" in done.stderr
    assert "address in use" in done.stderr


def test_up_refuses_a_bad_broker_count(tmp_path: Path) -> None:
    done = subprocess.run(
        up_command(tmp_path / "t", "--brokers", "0"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--brokers is 0; it must be 1..26" in done.stderr


def members(namesrv: str) -> list[tuple[str, int, str, str]]:
    with grpc.insecure_channel(namesrv) as channel:
        info = ns_grpc.NameServerStub(channel).GetClusterInfo(
            ns_pb.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S
        )
    return sorted(
        (b.broker_name, b.broker_id, b.address.storage, b.address.dispatch) for b in info.brokers
    )


def storage_status(storage: str) -> pb.StorageStatus:
    with grpc.insecure_channel(storage) as channel:
        status: pb.StorageStatus = pb_grpc.StorageStub(channel).GetStatus(
            pb.GetStatusRequest(), timeout=RPC_TIMEOUT_S
        )
    return status


def test_up_with_a_slave_per_broker(tmp_path: Path) -> None:
    root = tmp_path / "tide"
    stderr_path = tmp_path / "up.stderr"
    command = up_command(root, *ANY_PORT, "--replicas", "2", "--master-role", "SYNC_MASTER")
    with running_up(command, stderr_path) as proc:
        endpoints = read_endpoints(proc, stderr_path)
        assert {"storage", "dispatch", "storage-1", "dispatch-1"} <= set(endpoints), endpoints
        master, slave = endpoints["storage"], endpoints["storage-1"]
        want = [
            ("broker-a", 0, master, endpoints["dispatch"]),
            ("broker-a", 1, slave, endpoints["dispatch-1"]),
        ]
        wait_until(
            lambda: members(endpoints["nameserver"]) == want,
            "the master and its slave",
            timeout_s=START_TIMEOUT_S,
        )
        wait_until(
            lambda: storage_status(master).replication.slaves,
            "the slave connected",
            timeout_s=START_TIMEOUT_S,
        )
        assert storage_status(master).replication.role == "SYNC_MASTER"
        repl = storage_status(slave).replication
        assert (repl.role, repl.broker_id, repl.master_address) == ("SLAVE", 1, master)
        append(master, "Replicated")  # PUT_OK: a slave acknowledged it (SYNC_MASTER)
        wait_until(
            lambda: dispatched(endpoints["dispatch-1"], "Replicated"),
            "the slave's own dispatch to see the message",
            timeout_s=START_TIMEOUT_S,
        )
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, stderr_path.read_text()
    log = stderr_path.read_text()
    assert "stopped with status" not in log, log
    for store in ("store", "store-1"):
        assert (root / store / "consumequeue" / "Replicated" / "0").is_dir(), store
        assert not (root / store / "abort").exists(), store


def parse_up(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["up", "--store-dir", "/tmp/t", *argv])


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_replica_ports_and_stores_follow_the_documented_scheme() -> None:
    args = parse_up("--brokers", "2", "--replicas", "3")
    assert _check_args(args) is None
    by_name = {child.name: child for child in _children(args)}
    expected = {
        # name: (listen port, store, --master, --broker-id)
        "storage-a": ("10911", "broker-a", None, None),
        "storage-a-1": ("10912", "broker-a-1", "{storage-a}", "1"),
        "storage-a-2": ("10913", "broker-a-2", "{storage-a}", "2"),
        "storage-b": ("11011", "broker-b", None, None),
        "storage-b-2": ("11013", "broker-b-2", "{storage-b}", "2"),
    }
    for name, (port, store, master, broker_id) in expected.items():
        command = by_name[name].command
        assert flag(command, "--listen") == f"127.0.0.1:{port}", name
        assert flag(command, "--store-dir") == f"/tmp/t/{store}", name
        assert (flag(command, "--master") if master else None) == master, name
        assert (flag(command, "--broker-id") if broker_id else None) == broker_id, name
        assert flag(command, "--broker-name") == f"broker-{name[8]}", name
        dispatch = by_name["dispatch" + name.removeprefix("storage")].command
        assert flag(dispatch, "--listen") == f"127.0.0.1:{int(port) + 10}", name
        assert flag(dispatch, "--storage") == "{" + name + "}", name
        assert flag(command, "--dispatch-address") == flag(dispatch, "--listen"), name
    assert flag(by_name["storage-a"].command, "--role") == "ASYNC_MASTER"
    assert flag(by_name["storage-a-1"].command, "--role") == "SLAVE"
    ports = [flag(c.command, "--listen") for c in _children(args)]
    assert len(ports) == len(set(ports))  # no two services share a port


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (("--replicas", "0"), "--replicas is 0; it must be 1..4"),
        (("--replicas", "5"), "--replicas is 5; it must be 1..4"),
        (("--master-role", "SYNC_MASTER"), "--master-role SYNC_MASTER needs --replicas 2"),
        (("--brokers", "2", "--replicas", "2", "--storage-port", "65435"), "--storage-port"),
    ],
)
def test_up_refuses_bad_replica_options(argv: tuple[str, ...], problem: str) -> None:
    found = _check_args(parse_up(*argv))
    assert found is not None and problem in found


def test_up_with_auth_prints_the_admin_and_refuses_strangers(tmp_path: Path) -> None:
    root = tmp_path / "tide"
    stderr_path = tmp_path / "up.stderr"
    with running_up(up_command(root, *ANY_PORT, "--auth"), stderr_path) as proc:
        assert proc.stdout is not None
        banner = [proc.stdout.readline() for _ in range(3)]
        assert "admin (super) user" in banner[0], banner
        assert "TIDE_ACCESS_KEY=admin" in banner[1]
        endpoints = read_endpoints(proc, stderr_path)
        secret_path = root / "auth" / "admin.secret"
        assert str(secret_path) in banner[1]
        assert (secret_path.stat().st_mode & 0o777) == 0o600
        with grpc.insecure_channel(endpoints["storage"]) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                pb_grpc.StorageStub(channel).GetStatus(pb.GetStatusRequest(), timeout=RPC_TIMEOUT_S)
            assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
        cli = [sys.executable, "-m", "tide.cli"]
        gateway = ["--gateway", endpoints["gateway"]]
        unsigned = subprocess.run(
            [*cli, "topic", "create", "UpAuth", *gateway],
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert unsigned.returncode == 1 and "UNAUTHENTICATED" in unsigned.stderr.upper()
        env |= {"TIDE_ACCESS_KEY": "admin", "TIDE_SECRET_KEY": secret_path.read_text()}
        wait_until(
            lambda: (
                subprocess.run(
                    [*cli, "topic", "create", "UpAuth", *gateway],
                    env=env,
                    check=False,
                    capture_output=True,
                    timeout=120,
                ).returncode
                == 0
            ),
            "the admin's topic (once the gateway fetched the users)",
            timeout_s=START_TIMEOUT_S,
        )
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, stderr_path.read_text()
    assert secret_path.read_text() not in stderr_path.read_text()

"""``tide up`` starts the local cluster, prints endpoints, and stops it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import dispatch_pb2_grpc as dispatch_grpc
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

START_TIMEOUT_S = 60.0


def _read_endpoint(proc: subprocess.Popen[str], name: str) -> str:
    """The address printed for ``name`` in the endpoints table."""
    deadline = time.monotonic() + START_TIMEOUT_S
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"tide up ended before printing endpoints (status {proc.poll()})")
        words = line.split()
        if len(words) == 2 and words[0] == name:
            return words[1]
    raise AssertionError("no endpoints within the deadline")


def test_up_serves_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    root = tmp_path / "tide"
    cmd = [
        sys.executable,
        "-m",
        "tide.cli",
        "up",
        "--store-dir",
        str(root),
        "--storage-port",
        "0",
        "--dispatch-port",
        "0",
        "--segment-size-bytes",
        str(8 << 20),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        endpoint = _read_endpoint(proc, "storage")
        assert endpoint.startswith("127.0.0.1:") and not endpoint.endswith(":0")
        dispatch_endpoint = _read_endpoint(proc, "dispatch")
        with grpc.insecure_channel(endpoint) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            status = health.Check(health_pb2.HealthCheckRequest(service="tide.v1.Storage"))
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            reply = pb_grpc.StorageStub(channel).Append(
                pb.AppendRequest(messages=[pb.Message(topic="UpTopic", body=b"hi")])
            )
            assert reply.results[0].status == pb.PUT_OK
        with grpc.insecure_channel(dispatch_endpoint) as channel:
            dispatch = dispatch_grpc.DispatchStub(channel)
            request = dispatch_pb.GetQueueOffsetsRequest(topic="UpTopic", queue_id=0)
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:  # the dispatch follows the storage: the message gets an entry
                try:
                    if dispatch.GetQueueOffsets(request).max_offset == 1:
                        break
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
                assert time.monotonic() < deadline, "dispatch never saw the message"
                time.sleep(0.05)
        assert (root / "store" / "abort").exists()  # open while running
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not (root / "store" / "abort").exists(), "the store was not closed cleanly"
    assert (root / "store" / "commitlog" / "00000000000000000000").exists()
    assert (root / "store" / "consumequeue" / "UpTopic" / "0").is_dir()  # RocketMQ layout


def test_up_fails_fast_when_the_port_is_taken(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "tide.cli",
            "up",
            "--store-dir",
            str(tmp_path / "t"),
            "--storage-port",
            str(port),
            "--log-level",
            "warning",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "storage exited with status" in done.stderr
    assert "address in use" in done.stderr

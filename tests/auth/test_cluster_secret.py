"""Internal services authenticate each other with --cluster-secret-file: storage, dispatch
and name server refuse calls without the secret (health stays open), and a dispatch with
the secret follows its storage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.services.dispatch.conftest import DispatchLauncher
from tests.services.nameserver.process import NameServerLauncher
from tests.services.storage.conftest import StorageLauncher
from tide.server._cluster_secret import METADATA_KEY
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import dispatch_pb2_grpc as dispatch_grpc
from tide.v1 import nameserver_pb2 as ns_pb
from tide.v1 import nameserver_pb2_grpc as ns_grpc
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as storage_grpc
from tide.waiting import wait_until

SECRET = "cluster-secret-0123456789abcdef"
GOOD = ((METADATA_KEY, SECRET),)
TOPIC = "T_secret"


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def launchers(tmp_path: Path) -> Iterator[tuple[StorageLauncher, DispatchLauncher]]:
    storage = StorageLauncher(tmp_path / "procs")
    dispatch = DispatchLauncher(tmp_path / "procs")
    try:
        yield storage, dispatch
    finally:
        dispatch.close()
        storage.close()


def _raw(address: str) -> grpc.Channel:
    """A channel without the secret (the processes' own stubs send it)."""
    return grpc.insecure_channel(address)


def _refused(call: object) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    return caught.value.details() or ""


def test_storage_and_dispatch_take_calls_from_the_cluster_only(
    tmp_path: Path,
    secret_file: Path,
    launchers: tuple[StorageLauncher, DispatchLauncher],
) -> None:
    storages, dispatches = launchers
    flag = ("--cluster-secret-file", str(secret_file))
    storage = storages.start(tmp_path / "store", *flag)
    status = pb.GetStatusRequest()
    raw = storage_grpc.StorageStub(_raw(storage.listen))
    details = _refused(lambda: raw.GetStatus(status, timeout=10))
    assert "cluster secret" in details and SECRET not in details
    _refused(
        lambda: storage.stub.GetStatus(status, metadata=((METADATA_KEY, "x" * 30),), timeout=10)
    )
    raw.GetStatus(status, metadata=GOOD, timeout=10)
    health = health_pb2_grpc.HealthStub(storage.channel).Check(
        health_pb2.HealthCheckRequest(), timeout=5
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING

    topic = pb.TopicConfig(topic_name=TOPIC, read_queue_nums=1, write_queue_nums=1, perm=6)
    storage.stub.UpsertTopic(pb.UpsertTopicRequest(topic=topic), metadata=GOOD, timeout=10)
    append = pb.AppendRequest(messages=[pb.Message(topic=TOPIC, queue_id=0, body=b"x")])
    storage.stub.Append(append, metadata=GOOD, timeout=10)

    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen, *flag)
    offsets = dispatch_pb.GetQueueOffsetsRequest(topic=TOPIC, queue_id=0)
    raw_dispatch = dispatch_grpc.DispatchStub(_raw(dispatch.listen))
    _refused(lambda: raw_dispatch.GetQueueOffsets(offsets, timeout=10))
    wait_until(  # it tails the storage with the secret
        lambda: dispatch.stub.GetQueueOffsets(offsets, metadata=GOOD, timeout=10).max_offset == 1,
        "the dispatch following the storage",
    )
    assert SECRET not in storage.stderr() + dispatch.stderr()


def test_the_name_server_takes_calls_from_the_cluster_only(
    tmp_path: Path, secret_file: Path
) -> None:
    launcher = NameServerLauncher(tmp_path / "ns")
    try:
        nameserver = launcher.start("--cluster-secret-file", str(secret_file))
        request = ns_pb.GetClusterInfoRequest()
        raw = ns_grpc.NameServerStub(_raw(nameserver.listen))
        _refused(lambda: raw.GetClusterInfo(request, timeout=10))
        nameserver.stub.GetClusterInfo(request, metadata=GOOD, timeout=10)
    finally:
        launcher.close()


def test_a_short_secret_is_refused_at_start(
    tmp_path: Path, launchers: tuple[StorageLauncher, DispatchLauncher]
) -> None:
    short = tmp_path / "short.secret"
    short.write_text("tooshort")
    process = launchers[0].spawn(tmp_path / "store", "--cluster-secret-file", str(short))
    assert process.proc.wait(timeout=60) == 2
    assert (
        "16..1024 printable characters" in process.stderr() and "tooshort" not in process.stderr()
    )

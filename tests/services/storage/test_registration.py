"""A storage registers as a broker with real name servers: at start, on every topic
change, periodically (so a late or restarted name server learns it), independently per
name server, and unregisters on a clean stop."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import grpc
import pytest

from tests._service_process import free_port
from tests.services.nameserver.process import NameServerLauncher, NameServerProcess
from tests.services.storage.conftest import (
    RPC_TIMEOUT_S,
    StorageLauncher,
    expect_error,
    message,
)
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until

# --register-timeout-ms against a name server that never answers.
SILENT_TIMEOUT_MS = 6_000


@pytest.fixture
def nameservers(tmp_path: Path) -> Iterator[NameServerLauncher]:
    launcher = NameServerLauncher(tmp_path / "nameservers")
    try:
        yield launcher
    finally:
        launcher.close()


def routed_topics(ns: NameServerProcess) -> list[str]:
    return ns.topics()


def has_topics(ns: NameServerProcess, topics: list[str]) -> bool:
    return ns.topics() == topics


def has_members(ns: NameServerProcess, members: list[tuple[str, int, str, str]]) -> bool:
    return ns.members() == members


def test_registers_everywhere_and_follows_topic_changes(
    launcher: StorageLauncher, nameservers: NameServerLauncher, tmp_path: Path
) -> None:
    first, second = nameservers.start(), nameservers.start()
    storage = launcher.start(
        tmp_path / "store",
        "--namesrv",
        f"{first.listen};{second.listen}",
        "--cluster-name",
        "C1",
        "--broker-name",
        "broker-x",
        "--dispatch-address",
        "127.0.0.1:10921",
    )
    member = ("broker-x", 0, storage.listen, "127.0.0.1:10921")
    for ns in (first, second):
        wait_until(partial(has_members, ns, [member]), f"registration with {ns.listen}")
        assert list(ns.cluster_info().clusters["C1"].broker_names) == ["broker-x"]
    # The register interval is 30 s: these changes reach the name servers at once.
    config = pb.TopicConfig(topic_name="RegT", read_queue_nums=3, write_queue_nums=3)
    storage.stub.UpsertTopic(pb.UpsertTopicRequest(topic=config), timeout=RPC_TIMEOUT_S)
    storage.append([message("AutoT")])  # auto-created with the default 4 queues
    for ns in (first, second):
        wait_until(partial(has_topics, ns, ["AutoT", "RegT"]), f"topics on {ns.listen}")
        route = ns.route("RegT")
        assert [(q.broker_name, q.write_queue_nums) for q in route.queue_datas] == [("broker-x", 3)]
        assert route.broker_datas[0].addresses[0].storage == storage.listen
        assert ns.route("AutoT").queue_datas[0].read_queue_nums == 4
    storage.stub.DeleteTopic(pb.DeleteTopicRequest(topic="RegT"), timeout=RPC_TIMEOUT_S)
    wait_until(lambda: routed_topics(first) == ["AutoT"], "the deleted topic to lose its route")
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: first.route("RegT"), "RegT has no route")
    listed = storage.stub.ListTopics(pb.ListTopicsRequest(), timeout=RPC_TIMEOUT_S)
    wait_until(
        lambda: first.cluster_info().brokers[0].data_version.counter == listed.data_version_counter,
        "the latest data version on the name server",
    )
    storage.stop()  # a clean stop unregisters from both
    assert first.members() == [] and second.members() == []
    assert first.topics() == []
    assert f"unregistered from name server {second.listen}" in storage.stderr()


def test_a_late_name_server_is_registered_with_and_the_heartbeat_keeps_the_broker(
    launcher: StorageLauncher, nameservers: NameServerLauncher, tmp_path: Path
) -> None:
    port = free_port()
    storage = launcher.start(  # ready although its name server does not run yet
        tmp_path / "store",
        "--namesrv",
        f"127.0.0.1:{port}",
        "--register-interval-ms",
        "200",
        "--broker-heartbeat-timeout-ms",
        "1000",
    )
    wait_until(
        lambda: f"cannot register with name server 127.0.0.1:{port}" in storage.stderr(),
        "the failed registration to be logged",
    )
    ns = nameservers.start("--listen", f"127.0.0.1:{port}", "--scan-interval-ms", "50")
    wait_until(lambda: len(ns.members()) == 1, "registration with the late name server")
    assert ns.cluster_info().brokers[0].heartbeat_timeout_ms == 1000
    # Deliberately lets time pass, longer than the heartbeat timeout: only the periodic
    # registration keeps the broker listed.
    time.sleep(1.3)
    assert len(ns.members()) == 1, ns.stderr()
    storage.kill()  # no unregistration: the name server expires it
    wait_until(lambda: ns.members() == [], "the crashed broker to expire", timeout_s=10)
    assert "expired: no registration for 1000 ms" in ns.stderr()


def test_a_silent_name_server_does_not_delay_the_others(
    launcher: StorageLauncher, nameservers: NameServerLauncher, tmp_path: Path
) -> None:
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        silent_address = f"127.0.0.1:{silent.getsockname()[1]}"
        ns = nameservers.start()
        storage = launcher.start(
            tmp_path / "store",
            "--namesrv",
            f"{silent_address};{ns.listen}",
            "--register-timeout-ms",
            str(SILENT_TIMEOUT_MS),
        )
        started = time.monotonic()
        # A call to the silent one times out after 6 s; the live one does not wait for it
        # (half of that: a margin for a loaded box either way).
        within_s = SILENT_TIMEOUT_MS / 1000 / 2
        wait_until(
            lambda: len(ns.members()) == 1, "registration with the live name server", within_s
        )
        assert time.monotonic() - started < within_s
        wait_until(
            lambda: f"cannot register with name server {silent_address}" in storage.stderr(),
            "the timeout with the silent name server to be logged",
        )
        stopping = time.monotonic()
        storage.stop()  # unregistering is bounded by the same timeout
        assert time.monotonic() - stopping < SILENT_TIMEOUT_MS / 1000 + 5
    assert ns.members() == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--namesrv", "localhost"), "--namesrv must be HOST:PORT"),
        (("--namesrv", "a:1;a:1"), "--namesrv: an address is listed twice"),
        (("--broker-id", "-1"), "--broker-id is -1"),
        (("--broker-name", "a b"), "--broker-name 'a b' contains ' '"),
        (("--cluster-name", ""), "--cluster-name is empty"),
        (("--dispatch-address", "x:0"), "--dispatch-address must be HOST:PORT"),
        (("--register-interval-ms", "0"), "--register-interval-ms: 0 is outside"),
    ],
)
def test_bad_broker_options_stop_the_start(
    launcher: StorageLauncher, tmp_path: Path, args: tuple[str, ...], fragment: str
) -> None:
    process = launcher.spawn(tmp_path / "store", *args, ready_file=False)
    assert process.wait_exit() == 2
    assert fragment in process.stderr()

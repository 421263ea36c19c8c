"""Master/slave replication between real storage processes over real gRPC.

Checked: the slave's segments equal the master's byte for byte (blank markers and
segment rolls included), a slave started empty copies everything (from the master's min
offset when the head is gone), a stopped slave catches up, a slave with a longer tail
truncates to the master's, SYNC_MASTER's statuses, the slave's refusals, the status
fields, and the role options.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from services.storage import service as storage_service
from tests._service_process import child_env, free_port
from tests.services.nameserver.process import NameServerLauncher
from tests.services.storage.conftest import (
    REPO,
    SEGMENT_BYTES,
    StorageLauncher,
    StorageProcess,
    expect_error,
    message,
)
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until

FAST_HA = ("--ha-heartbeat-interval-ms", "500")


def start_master(
    launcher: StorageLauncher, store_dir: Path, *extra: str, port: int = 0
) -> StorageProcess:
    return launcher.start(store_dir, "--listen", f"127.0.0.1:{port}", *FAST_HA, *extra)


def start_slave(
    launcher: StorageLauncher, store_dir: Path, master: str, *extra: str
) -> StorageProcess:
    return launcher.start(
        store_dir, "--role", "SLAVE", "--broker-id", "1", "--master", master, *FAST_HA, *extra
    )


def produce(
    proc: StorageProcess, count: int, *, topic: str = "Repl", batch: int = 8, size: int = 20000
) -> list[pb.AppendResult]:
    results: list[pb.AppendResult] = []
    for start in range(0, count, batch):
        messages = [
            message(topic, i % 4, f"m{i}:".encode() + bytes([97 + i % 26]) * (i * 37 % size))
            for i in range(start, min(count, start + batch))
        ]
        results += proc.append(messages)
    return results


def wait_caught_up(master: StorageProcess, slave: StorageProcess) -> int:
    target = master.status().max_offset
    wait_until(lambda: slave.status().max_offset == target, f"the slave at {target}")
    return target


def segments_with_data(store_dir: Path) -> dict[str, bytes]:
    found = {}
    for path in sorted((store_dir / "commitlog").iterdir()):
        data = path.read_bytes()
        if any(data):
            found[path.name] = data
    return found


def assert_same_commitlog(master_dir: Path, slave_dir: Path) -> None:
    master, slave = segments_with_data(master_dir), segments_with_data(slave_dir)
    assert list(slave) == list(master)
    for name, data in master.items():
        assert slave[name] == data, f"segment {name} differs"


def queue_offsets(store_dir: Path) -> dict[str, int]:
    snapshot: dict[str, int] = json.loads((store_dir / "queue_offsets.json").read_text())[
        "queueOffsets"
    ]
    return snapshot


def test_slave_copies_the_master_byte_for_byte_and_refuses_writes(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    master = start_master(launcher, tmp_path / "master")
    slave = start_slave(launcher, tmp_path / "slave", master.listen)
    acked = produce(master, 400)
    end = wait_caught_up(master, slave)
    assert end > 2 * SEGMENT_BYTES  # several rolls, each ending with a blank marker
    assert_same_commitlog(tmp_path / "master", tmp_path / "slave")

    # Reads work on the slave, at the master's offsets.
    sample = acked[::37]
    found = slave.read((r.physical_offset, r.size) for r in sample)
    # The ids name the master that stored the records, as the producers got them.
    assert [f.message.msg_id for f in found] == [r.msg_id for r in sample]
    assert all(f.status == pb.FOUND for f in found)
    by_size = slave.read((r.physical_offset, 0) for r in sample[:3])  # the general decoder
    assert [f.message.msg_id for f in by_size] == [r.msg_id for r in sample[:3]]

    # Status on both sides.
    repl = slave.status().replication
    assert (repl.role, repl.master_address, repl.master_connected) == (
        "SLAVE",
        master.listen,
        True,
    )
    assert repl.lag_bytes == 0 and repl.master_max_offset == end
    wait_until(lambda: master.status().replication.slave_ack_offset == end, "the ack")
    mrepl = master.status().replication
    assert mrepl.role == "ASYNC_MASTER"
    assert len(mrepl.slaves) == 1
    assert (mrepl.slaves[0].broker_id, mrepl.slaves[0].ack_offset) == (1, end)
    assert mrepl.slaves[0].lag_bytes == 0 and mrepl.slaves[0].lag_seconds == 0

    # The slave refuses appends and topic changes, naming the master.
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: slave.append([message("Repl")]),
        f"this storage is a slave of {master.listen}; produce to the master",
    )
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: slave.stub.UpsertTopic(
            pb.UpsertTopicRequest(
                topic=pb.TopicConfig(topic_name="X", read_queue_nums=1, write_queue_nums=1, perm=6)
            )
        ),
        "change topics on the master",
    )
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: slave.stub.DeleteTopic(pb.DeleteTopicRequest(topic="Repl")),
        "change topics on the master",
    )
    # A slave is no master for another slave.
    third = launcher.spawn(
        tmp_path / "third",
        "--role",
        "SLAVE",
        "--broker-id",
        "2",
        "--master",
        slave.listen,
        *FAST_HA,
    )
    third.wait_ready()
    wait_until(lambda: "not a master" in third.stderr(), "the refusal in the third's log")

    # Queue offsets on the slave are the master's (seen in the snapshots of a clean stop).
    slave.stop()
    master.stop()
    assert queue_offsets(tmp_path / "slave") == queue_offsets(tmp_path / "master")


def test_empty_slave_copies_everything_and_a_stopped_one_catches_up(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    master = start_master(launcher, tmp_path / "master")
    produce(master, 200)
    slave = start_slave(launcher, tmp_path / "slave", master.listen)
    wait_caught_up(master, slave)
    assert_same_commitlog(tmp_path / "master", tmp_path / "slave")
    slave.stop()
    produce(master, 300, topic="Later")
    assert master.status().replication.slaves == []
    slave = start_slave(launcher, tmp_path / "slave", master.listen)
    wait_caught_up(master, slave)
    assert_same_commitlog(tmp_path / "master", tmp_path / "slave")
    # The master restarts; the slave reconnects by itself and follows.
    port = master.port
    master.stop()
    master = start_master(launcher, tmp_path / "master", port=port)
    produce(master, 50, topic="AfterRestart")
    wait_caught_up(master, slave)
    wait_until(lambda: slave.status().replication.master_connected, "the reconnect")
    assert_same_commitlog(tmp_path / "master", tmp_path / "slave")


def test_empty_slave_starts_at_the_masters_min_offset(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    master_dir = tmp_path / "master"
    master = start_master(launcher, master_dir)
    produce(master, 400)
    master.stop()
    # What retention does: the oldest segments are gone.
    first_two = sorted((master_dir / "commitlog").iterdir())[:2]
    for path in first_two:
        path.unlink()
    master = start_master(launcher, master_dir)
    assert master.status().min_offset == 2 * SEGMENT_BYTES
    slave = start_slave(launcher, tmp_path / "slave", master.listen)
    wait_caught_up(master, slave)
    assert slave.status().min_offset == 2 * SEGMENT_BYTES
    assert_same_commitlog(master_dir, tmp_path / "slave")


def test_slave_with_a_longer_tail_truncates_to_the_masters(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    master_dir, slave_dir = tmp_path / "master", tmp_path / "slave"
    master = start_master(launcher, master_dir)
    produce(master, 100)
    master.stop()
    shutil.copytree(master_dir, slave_dir)
    # The future slave gets bytes its master will never have.
    other = start_master(launcher, slave_dir)
    produce(other, 60, topic="Lost")
    longer = other.status().max_offset
    other.stop()
    master = start_master(launcher, master_dir)
    shorter = master.status().max_offset
    assert longer > shorter
    slave = start_slave(launcher, slave_dir, master.listen)
    # Truncated during the first handshake, before the slave serves (and a dispatch tails).
    assert slave.status().max_offset == shorter
    wait_until(
        lambda: (
            f"from its max offset {longer} to the master's max offset {shorter}" in slave.stderr()
        ),
        "the warning",
    )
    assert "WARNING" in slave.stderr()
    produce(master, 20, topic="After")
    wait_caught_up(master, slave)
    assert_same_commitlog(master_dir, slave_dir)
    slave.stop()
    master.stop()
    assert queue_offsets(slave_dir) == queue_offsets(master_dir)
    assert not any(key.startswith("Lost-") for key in queue_offsets(slave_dir))


def test_sync_master_statuses(launcher: StorageLauncher, tmp_path: Path) -> None:
    master = start_master(
        launcher, tmp_path / "master", "--role", "SYNC_MASTER", "--sync-slave-timeout-ms", "700"
    )
    results = master.append([message("Sync", 0, b"a"), message("Sync", 1, b"b")])
    assert [r.status for r in results] == [pb.SLAVE_NOT_AVAILABLE] * 2
    slave = start_slave(launcher, tmp_path / "slave", master.listen)
    wait_until(lambda: len(master.status().replication.slaves) == 1, "the slave connected")
    results = master.append([message("Sync", 0, b"c")] * 3)
    assert [r.status for r in results] == [pb.PUT_OK] * 3
    # The slave acknowledged past the record before the answer.
    assert (
        master.status().replication.slave_ack_offset
        >= results[-1].physical_offset + results[-1].size
    )
    os.kill(slave.proc.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        results = master.append([message("Sync", 0, b"d")])
        waited = time.monotonic() - began
        assert [r.status for r in results] == [pb.FLUSH_SLAVE_TIMEOUT]
        assert 0.6 < waited < 5, waited
        lag = master.status().replication.slaves[0]
        assert lag.lag_bytes > 0 and lag.lag_seconds > 0
    finally:
        os.kill(slave.proc.pid, signal.SIGCONT)
    wait_caught_up(master, slave)
    assert [r.status for r in master.append([message("Sync", 0, b"e")])] == [pb.PUT_OK]
    # A slave silent for 4 heartbeat intervals (2 s here) is dropped: no slave in sync.
    os.kill(slave.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: not master.status().replication.slaves, "the silent slave dropped")
        assert [r.status for r in master.append([message("Sync", 0, b"f")])] == [
            pb.SLAVE_NOT_AVAILABLE
        ]
    finally:
        os.kill(slave.proc.pid, signal.SIGCONT)
    wait_until(lambda: len(master.status().replication.slaves) == 1, "the slave back")
    wait_caught_up(master, slave)
    assert [r.status for r in master.append([message("Sync", 0, b"e")])] == [pb.PUT_OK]
    assert_same_commitlog(tmp_path / "master", tmp_path / "slave")


def run_storage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.storage", "--listen", "127.0.0.1:0", *args],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_bad_role_options_exit_2_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (("--role", "SLAVE", "--broker-id", "1"), "--role SLAVE needs --master HOST:PORT"),
        (("--role", "SLAVE", "--master", "127.0.0.1:10911"), "--role SLAVE needs --broker-id > 0"),
        (
            ("--role", "SLAVE", "--broker-id", "1", "--master", "nohost"),
            "--master must be HOST:PORT",
        ),
        (("--master", "127.0.0.1:10911"), "--master is for a slave"),
        (("--role", "SYNC_MASTER", "--broker-id", "2"), "needs --broker-id 0"),
        (("--role", "MASTER"), "expected one of ASYNC_MASTER, SYNC_MASTER, SLAVE"),
        (("--ha-batch-bytes", "10"), "--ha-batch-bytes: 10 is outside"),
        (
            ("--metadata-sync-interval-ms", "99"),
            "--metadata-sync-interval-ms: 99 is outside 100..3600000",
        ),
    ]
    # One real process: the exit code and the message as an operator sees them.
    (args, fragment), *others = cases
    done = run_storage("--store-dir", str(tmp_path / "s"), *args)
    assert done.returncode == 2, (args, done.stderr)
    assert fragment in done.stderr, (args, done.stderr)
    # The others through the same main() in this process (a process start each cost ~4 s
    # on a loaded box); should one be accepted, the service must not start.
    monkeypatch.setattr(storage_service, "run_service", _must_not_run)
    for args, fragment in others:
        argv = ["--listen", "127.0.0.1:0", "--store-dir", str(tmp_path / "s"), *args]
        with pytest.raises(SystemExit) as exited:
            storage_service.main(argv)
        stderr = capsys.readouterr().err
        assert exited.value.code == 2, (args, stderr)
        assert fragment in stderr, (args, stderr)
    assert not (tmp_path / "s").exists()


def _must_not_run(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("bad options were accepted: the service would start")


def test_slave_with_another_broker_name_is_refused(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    master = start_master(launcher, tmp_path / "master")
    free = free_port()
    slave = launcher.start(
        tmp_path / "slave",
        "--listen",
        f"127.0.0.1:{free}",
        "--role",
        "SLAVE",
        "--broker-id",
        "1",
        "--master",
        master.listen,
        "--broker-name",
        "broker-b",
        *FAST_HA,
    )
    wait_until(
        lambda: "start the slave with --broker-name broker-a" in slave.stderr(), "the refusal"
    )
    assert not slave.status().replication.master_connected


def test_two_slaves_follow_one_master_and_register_under_its_name(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    names = NameServerLauncher(tmp_path / "nameservers")
    try:
        ns = names.start()
        reg = ("--namesrv", ns.listen, "--broker-name", "broker-h")
        master = start_master(launcher, tmp_path / "master", *reg)
        master.stub.UpsertTopic(
            pb.UpsertTopicRequest(
                topic=pb.TopicConfig(
                    topic_name="Two", read_queue_nums=4, write_queue_nums=4, perm=6
                )
            )
        )
        slaves = [
            launcher.start(
                tmp_path / f"slave{i}",
                "--role",
                "SLAVE",
                "--broker-id",
                str(i),
                "--master",
                master.listen,
                *FAST_HA,
                *reg,
            )
            for i in (1, 2)
        ]
        produce(master, 120, topic="Two")
        for slave in slaves:
            wait_caught_up(master, slave)
            assert_same_commitlog(tmp_path / "master", slave.store_dir)
        repl = master.status().replication
        assert sorted(s.broker_id for s in repl.slaves) == [1, 2]
        wait_until(
            lambda: (
                [(m[0], m[1], m[2]) for m in ns.members()]
                == [("broker-h", i, p.listen) for i, p in enumerate([master, *slaves])]
            ),
            "the master and both slaves registered",
        )
        route = ns.route("Two")
        assert [q.broker_name for q in route.queue_datas] == ["broker-h"]
    finally:
        names.close()


def test_slave_whose_bytes_differ_from_the_masters_is_refused(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    master_dir, slave_dir = tmp_path / "master", tmp_path / "slave"
    master = start_master(launcher, master_dir)
    produce(master, 50)
    master.stop()
    shutil.copytree(master_dir, slave_dir)
    other = start_master(launcher, slave_dir)
    produce(other, 5, topic="Other")  # the same offsets get other bytes
    other.stop()
    master = start_master(launcher, master_dir)
    produce(master, 40, topic="Mine")
    assert master.status().max_offset > 0
    slave = start_slave(launcher, slave_dir, master.listen)
    wait_until(lambda: "its commitlog diverged" in slave.stderr(), "the refusal")
    assert "empty its --store-dir" in slave.stderr()
    assert not slave.status().replication.master_connected
    assert master.status().replication.slaves == []

"""Crashes (SIGKILL) with replication: SYNC_MASTER + SYNC_FLUSH loses no acknowledged
message when the master dies (it is on the slave), a killed slave recovers and catches
up, and a dispatch following the slave builds the master's consume queues."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc

from tests._service_process import CHANNEL_OPTIONS
from tests.services.dispatch.conftest import DispatchLauncher
from tests.services.storage.conftest import (
    RPC_TIMEOUT_S,
    StorageLauncher,
    message,
)
from tests.services.storage.test_replication import (
    assert_same_commitlog,
    produce,
    start_master,
    start_slave,
    wait_caught_up,
)
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc
from tide.waiting import wait_until

PRODUCERS = 3


class Producer(threading.Thread):
    """Appends batches until the master goes away; keeps every PUT_OK (offset, size, body)."""

    def __init__(self, address: str, client: int) -> None:
        super().__init__(name=f"producer-{client}", daemon=True)
        self.address = address
        self.client = client
        self.acked: list[tuple[int, int, bytes]] = []
        self.other_statuses = 0

    def run(self) -> None:
        with grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS) as channel:
            stub = pb_grpc.StorageStub(channel)
            seq = 0
            while True:
                bodies = [
                    f"c{self.client}-{seq + i}:".encode() + b"x" * (seq % 900) for i in range(4)
                ]
                request = pb.AppendRequest(
                    messages=[
                        message("Crash", (seq + i) % 4, body) for i, body in enumerate(bodies)
                    ]
                )
                try:
                    response = stub.Append(request, timeout=RPC_TIMEOUT_S)
                except grpc.RpcError:
                    return  # the master is gone
                for body, result in zip(bodies, response.results, strict=True):
                    if result.status == pb.PUT_OK:
                        self.acked.append((result.physical_offset, result.size, body))
                    else:
                        self.other_statuses += 1
                seq += 4


def test_sync_master_killed_loses_no_acknowledged_message(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    master = start_master(launcher, tmp_path / "master", "--role", "SYNC_MASTER", "--flush", "sync")
    slave = start_slave(launcher, tmp_path / "slave", master.listen, "--flush", "sync")
    wait_until(lambda: len(master.status().replication.slaves) == 1, "the slave connected")
    producers = [Producer(master.listen, client) for client in range(PRODUCERS)]
    for producer in producers:
        producer.start()
    wait_until(lambda: sum(len(p.acked) for p in producers) > 1500, "acknowledged messages")
    master.kill()
    for producer in producers:
        producer.join(timeout=30)
        assert not producer.is_alive()
    acked = [item for p in producers for item in p.acked]
    found = slave.read((offset, size) for offset, size, _ in acked)
    assert [r.status for r in found] == [pb.FOUND] * len(acked)
    assert [r.message.body for r in found] == [body for _, _, body in acked]
    # The slave's own SYNC_FLUSH group commit makes what it copied durable.
    last_end = max(offset + size for offset, size, _ in acked)
    wait_until(lambda: slave.status().flushed_offset >= last_end, "the slave's flush")
    # The master comes back (recovery after the crash); the slave follows it again.
    port = master.port
    master = start_master(
        launcher, tmp_path / "master", "--role", "SYNC_MASTER", "--flush", "sync", port=port
    )
    assert master.status().recovery.startswith("abnormal")
    wait_until(lambda: len(master.status().replication.slaves) == 1, "the slave reconnected")
    assert [r.status for r in master.append([message("Crash", 0, b"after")])] == [pb.PUT_OK]
    wait_caught_up(master, slave)
    assert_same_commitlog(tmp_path / "master", tmp_path / "slave")


def test_killed_slave_recovers_and_catches_up(launcher: StorageLauncher, tmp_path: Path) -> None:
    master = start_master(launcher, tmp_path / "master")
    slave = start_slave(launcher, tmp_path / "slave", master.listen)
    producer = Producer(master.listen, 0)
    producer.start()
    wait_until(lambda: len(producer.acked) > 300, "messages")
    slave.kill()
    wait_until(lambda: len(producer.acked) > 600, "more messages")
    slave = start_slave(launcher, tmp_path / "slave", master.listen)
    assert slave.status().recovery.startswith("abnormal")
    master.proc.send_signal(15)  # the producer ends with the master; nothing is lost
    master.wait_exit()
    producer.join(timeout=30)
    master = start_master(launcher, tmp_path / "master", port=master.port)
    wait_caught_up(master, slave)
    assert_same_commitlog(tmp_path / "master", tmp_path / "slave")


def test_dispatch_on_the_slave_builds_the_masters_consume_queues(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    master = start_master(launcher, tmp_path / "master")
    slave = start_slave(launcher, tmp_path / "slave", master.listen)
    dispatches = DispatchLauncher(tmp_path / "dispatch-procs")
    try:
        on_master = dispatches.start(tmp_path / "dm", master.listen)
        on_slave = dispatches.start(tmp_path / "ds", slave.listen)
        produce(master, 300, topic="Cq", size=4000)
        end = wait_caught_up(master, slave)
        on_master.wait_dispatched(end)
        on_slave.wait_dispatched(end)
        for queue_id in range(4):
            a = on_master.entries("Cq", queue_id, 0, 1000)
            b = on_slave.entries("Cq", queue_id, 0, 1000)
            assert len(a.entries) == 75
            assert a == b
        on_master.stop()
        on_slave.stop()
    finally:
        dispatches.close()
    cq_master = sorted(
        p.relative_to(tmp_path / "dm")
        for p in (tmp_path / "dm" / "consumequeue").rglob("*")
        if p.is_file()
    )
    cq_slave = sorted(
        p.relative_to(tmp_path / "ds")
        for p in (tmp_path / "ds" / "consumequeue").rglob("*")
        if p.is_file()
    )
    assert cq_master == cq_slave and cq_master
    for rel in cq_master:
        assert (tmp_path / "dm" / rel).read_bytes() == (tmp_path / "ds" / rel).read_bytes(), rel

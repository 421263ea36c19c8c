"""Crashes of a real storage process (SIGKILL), torn tails and corruption made by hand.

What is checked after each restart: every acknowledged message is there byte for byte,
the recovery path and its report, queue offsets without duplicates, and the offline
verifier (``python -m tide.cli store verify``).
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.services.storage.conftest import (
    RPC_TIMEOUT_S,
    StorageLauncher,
    StorageProcess,
    message,
    run_cli,
    verify_store,
)
from tide.format import QUEUE_OFFSET_POS
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc
from tide.waiting import wait_until

CLIENTS = 3
CYCLES = 5
BATCH = 4
QUEUES = 4
TOPICS = ("CrashA", "CrashB")
# formats.md: the body of a record with IPv4 hosts starts after 88 header bytes
# (total_size .. body_length); the physical offset field follows the queue offset.
BODY_POS_V4 = 88
PHYSICAL_OFFSET_POS = QUEUE_OFFSET_POS + 8


@dataclass(frozen=True)
class Acked:
    """An acknowledged message: what was sent and where the store put it."""

    topic: str
    queue_id: int
    body: bytes
    physical_offset: int
    size: int
    queue_offset: int
    cycle: int


def body_for(client: int, seq: int, rng: random.Random) -> bytes:
    head = f"c{client}-{seq}:".encode()
    return head + bytes([97 + seq % 26]) * rng.randrange(0, 3000)


class Producer(threading.Thread):
    """Appends batches until the server goes away; keeps every PUT_OK result."""

    def __init__(self, client: int, listen: str, cycle: int, first_seq: int, seed: int) -> None:
        super().__init__(name=f"producer-{client}", daemon=True)
        self.client = client
        self.listen = listen
        self.cycle = cycle
        self.seq = first_seq
        self.rng = random.Random(seed)
        self.acked: list[Acked] = []
        self.not_acknowledged = 0  # written but not PUT_OK (e.g. FLUSH_DISK_TIMEOUT)
        self.ended_by: str = ""
        self.stop_event = threading.Event()

    def run(self) -> None:
        with grpc.insecure_channel(self.listen) as channel:
            stub = pb_grpc.StorageStub(channel)
            while not self.stop_event.is_set():
                batch = []
                for _ in range(BATCH):
                    topic = TOPICS[self.rng.randrange(len(TOPICS))]
                    queue_id = self.rng.randrange(QUEUES)
                    batch.append(
                        message(topic, queue_id, body_for(self.client, self.seq, self.rng))
                    )
                    self.seq += 1
                try:
                    response = stub.Append(pb.AppendRequest(messages=batch), timeout=RPC_TIMEOUT_S)
                except grpc.RpcError as exc:
                    self.ended_by = repr(exc)
                    return
                for sent, result in zip(batch, response.results, strict=True):
                    if result.status != pb.PUT_OK:
                        self.not_acknowledged += 1
                        continue
                    self.acked.append(
                        Acked(
                            sent.topic,
                            sent.queue_id,
                            sent.body,
                            result.physical_offset,
                            result.size,
                            result.queue_offset,
                            self.cycle,
                        )
                    )


def check_acknowledged(storage: StorageProcess, acked: list[Acked], context: str) -> None:
    """Every acknowledged message reads back byte-exact at its position."""
    found = storage.read([(a.physical_offset, a.size) for a in acked])
    missing = []
    for want, got in zip(acked, found, strict=True):
        msg = got.message
        if got.status != pb.FOUND or (
            msg.topic,
            msg.queue_id,
            msg.body,
            msg.queue_offset,
            msg.physical_offset,
        ) != (want.topic, want.queue_id, want.body, want.queue_offset, want.physical_offset):
            missing.append((want, pb.ReadStatus.Name(got.status), msg.body[:20]))
    assert not missing, f"{context}: {len(missing)} acknowledged messages lost: {missing[:5]}"


def check_queue_offsets(acked: list[Acked], context: str) -> None:
    """Per queue, acknowledged messages have unique queue offsets that grow with the
    physical offset (no reuse after a crash)."""
    by_queue: dict[tuple[str, int], list[Acked]] = defaultdict(list)
    for a in acked:
        by_queue[a.topic, a.queue_id].append(a)
    for key, items in by_queue.items():
        items.sort(key=lambda a: a.physical_offset)
        offsets = [a.queue_offset for a in items]
        assert len(set(offsets)) == len(offsets), f"{context}: duplicate queue offsets in {key}"
        assert offsets == sorted(offsets), f"{context}: queue offsets out of order in {key}"


def run_cycle(
    storage: StorageProcess,
    cycle: int,
    next_seq: list[int],
    rng: random.Random,
    context: str,
) -> list[Acked]:
    """Producers append until a SIGKILL at a random moment; returns what was acknowledged."""
    producers = [
        Producer(c, storage.listen, cycle, next_seq[c], rng.randrange(1 << 30))
        for c in range(CLIENTS)
    ]
    for producer in producers:
        producer.start()
    wait_until(
        lambda: all(len(p.acked) >= 2 * BATCH for p in producers),
        f"{context}: acknowledged appends from every client",
    )
    # Deliberately lets time pass: the kill lands at a random point of the appends.
    time.sleep(rng.uniform(0.0, 0.5))
    storage.kill()
    acked: list[Acked] = []
    for producer in producers:
        producer.stop_event.set()
        producer.join(timeout=RPC_TIMEOUT_S + 10)
        assert not producer.is_alive(), f"{context}: producer {producer.client} hangs"
        acked += producer.acked
        next_seq[producer.client] = producer.seq
    assert any(p.ended_by for p in producers), f"{context}: the kill must hit appends in flight"
    return acked


def check_restart_after_crash(storage: StorageProcess, acked: list[Acked], context: str) -> None:
    status = storage.status()
    assert status.flush_mode == "sync"
    assert status.recovery.startswith("abnormal"), f"{context}: {status.recovery}"
    assert "CORRUPTION" not in status.recovery, f"{context}: {status.recovery}"
    check_acknowledged(storage, acked, context)
    assert status.max_offset >= max(a.physical_offset + a.size for a in acked)


def last_queue_offsets(acked: list[Acked]) -> dict[tuple[str, int], int]:
    last: dict[tuple[str, int], int] = {}
    for a in acked:
        key = (a.topic, a.queue_id)
        last[key] = max(last.get(key, -1), a.queue_offset)
    return last


def check_dumped_queue_offsets(store: Path, queues_expected: set[tuple[str, int]]) -> None:
    """The whole log: in every queue the offsets are 0, 1, 2, ... in commitlog order."""
    dumped = run_cli("store", "dump", str(store))
    assert dumped.returncode == 0, dumped.stderr
    queues: dict[tuple[str, int], list[int]] = defaultdict(list)
    for line in dumped.stdout.splitlines():
        record = json.loads(line)
        queues[record["topic"], record["queue_id"]].append(record["queue_offset"])
    assert queues_expected <= set(queues)
    for key, offsets in queues.items():
        assert offsets == list(range(len(offsets))), f"queue {key}: {offsets[:50]}"


@pytest.mark.parametrize(
    "mode", [(), ("--write-buffer-pool",)], ids=["mapped-segments", "write-buffer-pool"]
)
def test_sigkill_during_sync_flush_appends_loses_nothing_acknowledged(
    launcher: StorageLauncher, tmp_path: Path, mode: tuple[str, ...]
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    store = tmp_path / "store"
    args = ("--flush", "sync", *mode)
    acked: list[Acked] = []
    next_seq = [0] * CLIENTS
    for cycle in range(CYCLES):
        context = f"cycle {cycle} (seed {seed})"
        storage = launcher.start(store, *args)
        if cycle == 0:
            assert storage.status().recovery.startswith("normal")
        else:
            check_restart_after_crash(storage, acked, context)
        acked += run_cycle(storage, cycle, next_seq, rng, context)
        check_queue_offsets(acked, context)
        assert (store / "abort").exists(), f"{context}: SIGKILL leaves the abort file"
        verified = verify_store(store)
        assert verified.returncode == 0, f"{context}: {verified.stdout}{verified.stderr}"

    final = launcher.start(store, *args)
    check_restart_after_crash(final, acked, f"after {CYCLES} crashes (seed {seed})")
    # New appends continue every queue after its last acknowledged offset.
    last = last_queue_offsets(acked)
    keys = sorted(last)
    results = final.append([message(t, q, b"after") for t, q in keys])
    for key, result in zip(keys, results, strict=True):
        assert result.queue_offset > last[key], key
    final.stop()
    verified = verify_store(store)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    check_dumped_queue_offsets(store, set(keys))


def append_some(storage: StorageProcess, count: int) -> list[pb.AppendResult]:
    results: list[pb.AppendResult] = []
    for start in range(0, count, 10):
        results += storage.append(
            [message("Torn", i % 2, f"msg-{i}".encode() * 20) for i in range(start, start + 10)]
        )
    return results


@pytest.mark.parametrize("torn_bytes", ["half", "header", "batch-head-stored-last"])
def test_torn_tail_written_on_purpose(
    launcher: StorageLauncher, tmp_path: Path, torn_bytes: str
) -> None:
    store = tmp_path / "store"
    storage = launcher.start(store)
    results = append_some(storage, 30)
    end = storage.status().max_offset
    storage.stop()

    # The start of a real record (half of it, or its fixed header only), its physical
    # offset set to where it would have been written: a crash while copying it. Its
    # total_size says more bytes follow than there are. Or a batch of two records whose
    # first 32 bytes are zeros: glibc's memcpy stores a copy's first bytes last, so a
    # SIGKILL can leave the rest of the batch in the file, valid records after a hole.
    segment = store / "commitlog" / "00000000000000000000"
    data = bytearray(segment.read_bytes())
    model = data[results[3].physical_offset : results[3].physical_offset + results[3].size]
    struct.pack_into(">q", model, PHYSICAL_OFFSET_POS, end)
    torn: bytes | bytearray
    if torn_bytes == "batch-head-stored-last":
        second = data[results[4].physical_offset : results[4].physical_offset + results[4].size]
        struct.pack_into(">q", second, PHYSICAL_OFFSET_POS, end + len(model))
        torn = bytes(32) + model[32:] + second
    else:
        torn = model[: len(model) // 2] if torn_bytes == "half" else model[:BODY_POS_V4]
    data[end : end + len(torn)] = torn
    segment.write_bytes(data)
    (store / "abort").touch()
    verified = verify_store(store)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "torn tail" in verified.stdout, verified.stdout

    again = launcher.start(store)
    status = again.status()
    assert status.recovery.startswith("abnormal"), status.recovery
    assert "CORRUPTION" not in status.recovery, status.recovery
    assert f"torn tail at {end}" in status.recovery, status.recovery
    if torn_bytes == "batch-head-stored-last":
        assert "an interrupted write" in status.recovery, status.recovery
    assert status.max_offset == end
    assert status.recovery_truncated_bytes > 0
    check_acknowledged(
        again,
        [
            Acked(
                "Torn",
                i % 2,
                f"msg-{i}".encode() * 20,
                r.physical_offset,
                r.size,
                r.queue_offset,
                0,
            )
            for i, r in enumerate(results)
        ],
        "after a torn tail",
    )
    (new,) = again.append([message("Torn", 0, b"new")])
    assert new.physical_offset == end
    assert new.queue_offset == 15
    found = again.read([(new.physical_offset, new.size)])
    assert found[0].message.body == b"new"
    again.stop()
    verified = verify_store(store)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "torn tail" not in verified.stdout, verified.stdout


def test_corruption_in_the_middle_is_reported(launcher: StorageLauncher, tmp_path: Path) -> None:
    store = tmp_path / "store"
    storage = launcher.start(store)
    results = append_some(storage, 30)
    storage.stop()

    bad = results[2]
    segment = store / "commitlog" / "00000000000000000000"
    data = bytearray(segment.read_bytes())
    data[bad.physical_offset + BODY_POS_V4 + 5] ^= 0xFF
    segment.write_bytes(data)
    (store / "abort").touch()
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)

    again = launcher.start(store)
    status = again.status()
    assert status.recovery.startswith("abnormal"), status.recovery
    assert "CORRUPTION" in status.recovery, status.recovery
    assert str(bad.physical_offset) in status.recovery, status.recovery
    # The records before the damage are intact.
    before = again.read([(r.physical_offset, r.size) for r in results[:2]])
    assert [r.message.body for r in before] == [f"msg-{i}".encode() * 20 for i in range(2)]
    again.stop()

    verified = verify_store(copy)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "CORRUPTION" in verified.stdout and str(bad.physical_offset) in verified.stdout

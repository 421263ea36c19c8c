"""Append memory bounded by bytes (``--max-append-in-flight-bytes``) on a real storage
process: an Append past the limit gets RESOURCE_EXHAUSTED naming it and writes nothing
(in-band on an AppendStream, which goes on); concurrent appends held by sync flushes
stay under the limit, and everything acknowledged is stored."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests._metrics import scrape, total
from tests.services.storage.conftest import (
    MAX_BODY_BYTES,
    RPC_TIMEOUT_S,
    StorageLauncher,
    StorageProcess,
    expect_error,
    message,
)
from tests.services.storage.test_append_stream import exchange, run_of
from tide.commitlog import iter_records
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until

MIB = 1024 * 1024
LIMIT_BYTES = 2 * MIB
BODY_BYTES = MAX_BODY_BYTES - 1024
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
LIMIT_TEXT = f"max_append_in_flight_bytes ({LIMIT_BYTES} bytes)"
WAIT_S = 60.0


@pytest.fixture
def storage(launcher: StorageLauncher, tmp_path: Path) -> Iterator[StorageProcess]:
    # Sync flush: each Append is held until the disk answered, so concurrent ones pile up.
    process = launcher.start(
        tmp_path / "store",
        "--max-append-in-flight-bytes",
        str(LIMIT_BYTES),
        "--flush",
        "sync",
        "--metrics-listen",
        "127.0.0.1:0",
    )
    yield process
    process.stop()


def batch(topic: str, count: int, fill: int = 0) -> pb.AppendRequest:
    return pb.AppendRequest(
        messages=[message(topic, 0, bytes([fill % 251]) * BODY_BYTES) for _ in range(count)]
    )


def metric(storage: StorageProcess, name: str) -> float:
    return total(scrape(str(storage.ready["metrics"])), name)


def stored_offsets(storage: StorageProcess) -> list[int]:
    """The physical offset of every record in the store (read offline: the commitlog
    files themselves, not what the service says)."""
    return [at.offset for at in iter_records(storage.store_dir / "commitlog")]


def test_an_append_larger_than_the_limit_is_refused_and_writes_nothing(
    storage: StorageProcess, topic_name: str
) -> None:
    too_big = batch(topic_name, LIMIT_BYTES // BODY_BYTES + 2)
    assert too_big.ByteSize() > LIMIT_BYTES
    expect_error(
        EXHAUSTED,
        lambda: storage.stub.Append(too_big, timeout=RPC_TIMEOUT_S),
        LIMIT_TEXT,
        "send smaller requests",
    )
    answers = asyncio.run(exchange(storage, [too_big, batch(topic_name, 2)]))
    assert answers[0].error_code == EXHAUSTED.value[0]
    assert LIMIT_TEXT in answers[0].error_message
    assert answers[1].error_code == 0
    results = answers[1].response.results
    assert [r.status for r in results] == [pb.PUT_OK, pb.PUT_OK]
    # Only the two messages of the second request were written.
    assert stored_offsets(storage) == [r.physical_offset for r in results]


def test_records_count_their_bytes_against_the_limit(
    storage: StorageProcess, topic_name: str
) -> None:
    """An Append of records holds the records' bytes (the run joined from them): runs
    adding up to more than the limit are refused whole, in-band on a stream too, and
    runs just under it are written."""
    body = bytes(BODY_BYTES)
    per_run = 4
    run = run_of(topic_name, *[body] * per_run)
    over = LIMIT_BYTES // len(run) + 1  # runs whose bytes add up to more than the limit
    too_big = pb.AppendRequest(records=[run] * over)
    assert len(run) * over > LIMIT_BYTES
    fits = pb.AppendRequest(records=[run] * (over - 1))
    assert len(run) * (over - 1) < LIMIT_BYTES
    expect_error(
        EXHAUSTED,
        lambda: storage.stub.Append(too_big, timeout=RPC_TIMEOUT_S),
        f"this request is {len(run) * over} bytes",
        LIMIT_TEXT,
    )
    answers = asyncio.run(exchange(storage, [too_big, fits]))
    assert answers[0].error_code == EXHAUSTED.value[0]
    assert f"this request is {len(run) * over} bytes" in answers[0].error_message
    assert answers[1].error_code == 0
    written = answers[1].response
    assert len(written.physical_offsets) == per_run * (over - 1)
    assert stored_offsets(storage) == list(written.physical_offsets)


def test_concurrent_appends_stay_under_the_limit_and_lose_nothing_acknowledged(
    storage: StorageProcess, topic_name: str
) -> None:
    per_call = 12  # ~0.75 MiB: two fit, the third does not
    acked: list[pb.AppendResult] = []
    refusals: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        try:
            for round_ in range(4):
                request = batch(topic_name, per_call, fill=index * 10 + round_)
                try:
                    response = storage.stub.Append(request, timeout=RPC_TIMEOUT_S)
                except grpc.RpcError as exc:
                    assert isinstance(exc, grpc.Call)
                    assert exc.code() is EXHAUSTED, exc.details()
                    with lock:
                        refusals.append(exc.details() or "")
                    continue
                with lock:
                    acked.extend(response.results)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not any(t.is_alive() for t in threads) and not failures, failures
    assert len(acked) + len(refusals) * per_call == 6 * 4 * per_call
    assert all(LIMIT_TEXT in text and "retry later" in text for text in refusals)
    assert all(r.status == pb.PUT_OK for r in acked)
    # Everything acknowledged is stored, and nothing refused was written.
    assert stored_offsets(storage) == sorted(r.physical_offset for r in acked)
    stored = storage.read((r.physical_offset, r.size) for r in acked)
    assert all(len(s.message.body) == BODY_BYTES for s in stored)
    wait_until(
        lambda: metric(storage, "tide_storage_append_in_flight_peak_bytes") > 0,
        "the append gauges sampled",
        timeout_s=WAIT_S,
    )
    assert metric(storage, "tide_storage_append_in_flight_peak_bytes") <= LIMIT_BYTES
    assert metric(storage, "tide_storage_append_refused_total") >= len(refusals)

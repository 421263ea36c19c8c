"""A storage process on a real small disk (a tmpfs) that fills up: appends are answered
RESOURCE_EXHAUSTED (unary and in-band on AppendStream, which stays open), the store says
it is not writable, every acknowledged message stays readable, no partly created
segment is left; once space is freed, appends succeed again without a restart."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests._tmpfs import fill, mounted_tmpfs
from tests.services.storage.conftest import (
    RPC_TIMEOUT_S,
    SEGMENT_BYTES,
    StorageLauncher,
    StorageProcess,
    cancel,
    expect_error,
    message,
    segment_files,
)
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until

DISK_BYTES = 8 * SEGMENT_BYTES
BODY_BYTES = 60 * 1024
STREAM_TIMEOUT_S = 120.0
# Thresholds at 100 %: nothing is refused or deleted before the disk is really full (a
# refusal then means the next segment cannot be allocated), every message stays.
FULL_DISK_ARGS = (
    "--disk-clean-ratio",
    "1.0",
    "--disk-clean-force-ratio",
    "1.0",
    "--disk-refuse-writes-ratio",
    "1.0",
)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "disk", DISK_BYTES) as disk:
        yield disk


@pytest.fixture
def storage_on_small_disk(small_disk: Path, tmp_path: Path) -> Iterator[StorageProcess]:
    launcher = StorageLauncher(tmp_path / "procs")  # its logs off the small disk
    try:
        yield launcher.start(small_disk / "store", *FULL_DISK_ARGS)
    finally:
        launcher.close()  # before the tmpfs is unmounted


class AppendStream:
    """One AppendStream call: a request in, its answer out, in order."""

    def __init__(self, storage: StorageProcess) -> None:
        self._requests: queue.Queue[pb.AppendRequest | None] = queue.Queue()
        # (an iterator of the answers and a grpc.Call: typed as either by grpc-stubs)
        self._call: Any = storage.stub.AppendStream(
            iter(self._requests.get, None), timeout=STREAM_TIMEOUT_S
        )

    def append(self, request: pb.AppendRequest) -> pb.AppendStreamResponse:
        self._requests.put(request)
        answer = next(self._call)
        assert isinstance(answer, pb.AppendStreamResponse), answer
        return answer

    def close(self) -> None:
        self._requests.put(None)
        cancel(self._call)


def request(topic: str, index: int) -> pb.AppendRequest:
    body = index.to_bytes(4, "big") * (BODY_BYTES // 4)
    return pb.AppendRequest(messages=[message(topic, 0, body)])


def fill_until_refused(
    storage: StorageProcess, topic: str
) -> tuple[list[pb.AppendResult], grpc.RpcError]:
    acked: list[pb.AppendResult] = []
    for index in range(10 * DISK_BYTES // BODY_BYTES):
        try:
            response = storage.stub.Append(request(topic, index), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            return acked, exc
        acked.extend(response.results)
    pytest.fail(f"{len(acked)} appends of {BODY_BYTES} bytes all fit on a {DISK_BYTES} disk")


def assert_readable(storage: StorageProcess, acked: list[pb.AppendResult]) -> None:
    results = storage.read([(r.physical_offset, r.size) for r in acked])
    for index, (ack, result) in enumerate(zip(acked, results, strict=True)):
        assert result.status == pb.FOUND, (index, ack, result.status)
        assert result.message.queue_offset == ack.queue_offset
        assert result.message.body == index.to_bytes(4, "big") * (BODY_BYTES // 4)


def test_a_full_disk_answers_resource_exhausted_and_writes_resume_when_space_is_freed(
    small_disk: Path, storage_on_small_disk: StorageProcess, topic_name: str
) -> None:
    storage = storage_on_small_disk
    commitlog = storage.store_dir / "commitlog"
    # The segment being written and the next one (created ahead of need) exist; then
    # a filler leaves less than a segment free: the one after cannot be created.
    wait_until(lambda: len(segment_files(storage.store_dir)) == 2, "the next segment")
    filler = small_disk / "filler"
    fill(filler, SEGMENT_BYTES // 2)
    assert storage.status().writable

    acked, refused = fill_until_refused(storage, topic_name)
    assert isinstance(refused, grpc.Call)
    details = refused.details() or ""
    assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert str(storage.store_dir) in details and "free" in details, details
    assert len(acked) >= SEGMENT_BYTES // BODY_BYTES  # at least the two segments' worth
    assert not storage.status().writable

    stream = AppendStream(storage)
    try:
        for attempt in range(2):  # answered in-band, and the stream goes on
            answer = stream.append(request(topic_name, len(acked)))
            assert answer.error_code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], answer
            assert str(storage.store_dir) in answer.error_message, answer
            assert not answer.HasField("response"), (attempt, answer)
        # Nothing half-created is left: the two segments and no partial third.
        assert [p.name for p in sorted(commitlog.iterdir())] == [
            p.name for p in segment_files(storage.store_dir)
        ]
        assert len(segment_files(storage.store_dir)) == 2
        assert_readable(storage, acked)

        # Not a byte left: a config write (topics.json) fails alike, and leaves no file.
        config_files = sorted((storage.store_dir / "config").iterdir())
        fill(small_disk / "filler-rest", 0)
        new_topic = pb.TopicConfig(
            topic_name=f"{topic_name}_new", read_queue_nums=1, write_queue_nums=1, perm=6
        )
        upsert = pb.UpsertTopicRequest(topic=new_topic)
        details = expect_error(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            lambda: storage.stub.UpsertTopic(upsert, timeout=RPC_TIMEOUT_S),
            str(storage.store_dir),
            "topics.json",
        )
        assert "free" in details
        group = pb.UpsertGroupRequest(group=pb.GroupConfig(group_name="g_full"))
        expect_error(  # and subscriptionGroup.json
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            lambda: storage.stub.UpsertGroup(group, timeout=RPC_TIMEOUT_S),
            str(storage.store_dir),
            "subscriptionGroup.json",
        )
        assert sorted((storage.store_dir / "config").iterdir()) == config_files
        (small_disk / "filler-rest").unlink()

        filler.unlink()
        answers: list[Any] = []

        def appended() -> bool:
            answers.append(answer := stream.append(request(topic_name, len(acked))))
            if answer.error_code:
                assert answer.error_code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], answer
            return not answer.error_code

        wait_until(
            appended, "appends accepted again", 20, interval_s=0.05, state=lambda: answers[-1]
        )
        (result,) = answers[-1].response.results
        assert result.status == pb.PUT_OK
        acked.append(result)
    finally:
        stream.close()
    acked.extend(storage.append([request(topic_name, len(acked)).messages[0]]))
    assert storage.status().writable
    assert len(segment_files(storage.store_dir)) >= 3
    assert_readable(storage, acked)
    storage.stop()

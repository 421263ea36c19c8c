"""``Storage.ReadStream`` against a real storage process: answers in order equal to what
``Read`` gives, errors in-band with Read's code and message (the stream goes on), idle
streams end at shutdown."""

from __future__ import annotations

import asyncio
import signal
import time
from functools import partial
from pathlib import Path

import grpc

from tests.services.storage.conftest import (
    RPC_TIMEOUT_S,
    StorageLauncher,
    StorageProcess,
    message,
    rpc_error,
)
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)


def positions(*pairs: tuple[int, int]) -> pb.ReadRequest:
    return pb.ReadRequest(
        positions=[pb.ReadRequest.Position(physical_offset=o, size=s) for o, s in pairs]
    )


async def exchange(
    storage: StorageProcess, requests: list[pb.ReadRequest]
) -> list[pb.ReadStreamResponse]:
    """Each request written after the previous one's answer came, on one stream."""
    async with grpc.aio.insecure_channel(storage.listen) as channel:
        call = pb_grpc.StorageStub(channel).ReadStream(None, timeout=RPC_TIMEOUT_S)
        answers = []
        for request in requests:
            await call.write(request)
            answer = await call.read()
            assert isinstance(answer, pb.ReadStreamResponse), answer
            answers.append(answer)
        await call.done_writing()
        assert await call.read() is EOF
        assert await call.code() is grpc.StatusCode.OK
        return answers


def check_as_unary(
    storage: StorageProcess,
    requests: list[pb.ReadRequest],
    answers: list[pb.ReadStreamResponse],
    good: list[pb.ReadRequest],
) -> None:
    """Each stream answer is what the unary Read answers: the same response for a
    request in ``good``, else in-band the code and message the unary call fails with."""
    for request, answer in zip(requests, answers, strict=True):
        if request in good:
            assert not answer.error_code
            assert answer.response == storage.stub.Read(request, timeout=RPC_TIMEOUT_S)
            continue
        unary = rpc_error(partial(storage.stub.Read, request, timeout=RPC_TIMEOUT_S))
        assert answer.error_code == unary.code().value[0]
        assert answer.error_message == unary.details()
        assert answer.error_message
        assert not answer.HasField("response")


def test_answers_equal_read_and_errors_are_in_band(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    results = shared_storage.append([message(topic_name, 0, f"m{i}".encode()) for i in range(5)])
    found = [(r.physical_offset, r.size) for r in results]
    max_offset = shared_storage.status().max_offset
    good = [
        positions(*found),
        positions(found[2], (found[0][0], 0)),  # size 0: the record's own size
        positions((max_offset + 100, 50), found[4]),  # past the end, then found
    ]
    bad = [
        positions(*[found[0]] * 1025),  # too many positions
        positions((-1, 10)),
        positions((0, 70 << 20)),  # too many bytes
    ]
    requests = [good[0], bad[0], good[1], bad[1], bad[2], good[2]]
    answers = asyncio.run(exchange(shared_storage, requests))
    check_as_unary(shared_storage, requests, answers, good)
    assert [len(answers[i].response.results) for i in (0, 2, 5)] == [5, 2, 2]


def test_sigterm_ends_idle_read_streams(launcher: StorageLauncher, tmp_path: Path) -> None:
    storage = launcher.start(tmp_path / "store", "--shutdown-grace-s", "25")
    asyncio.run(_sigterm_ends_idle_read_streams(storage))


async def _sigterm_ends_idle_read_streams(storage: StorageProcess) -> None:
    async with grpc.aio.insecure_channel(storage.listen) as channel:
        call = pb_grpc.StorageStub(channel).ReadStream(None)
        await call.write(positions((0, 0)))
        answer = await call.read()
        assert isinstance(answer, pb.ReadStreamResponse) and not answer.error_code
        storage.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert await asyncio.wait_for(call.read(), 15) is EOF  # the idle stream ended
        assert await call.code() is grpc.StatusCode.OK
        code = await asyncio.to_thread(storage.wait_exit)
        assert time.monotonic() - started < 15, "an open ReadStream held the shutdown"
        assert code == 0, storage.describe()
    log = storage.stderr()
    assert "read stream from" in log and "ended after 1 reads" in log

"""``Storage.AppendStream`` against a real storage process: answers in order with what
``Append`` gives, errors in-band (the stream goes on), idle streams end at shutdown."""

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
    expect_error,
    message,
)
from tide.format import RunWriter
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)


def run_of(topic: str, *bodies: bytes, queue_id: int = 0) -> bytes:
    writer = RunWriter(bytes([127, 0, 0, 1, 0, 0, 0x1F, 0x90]))
    for body in bodies:
        writer.add(topic, topic.encode(), queue_id, body, b"", 0, 0, 1_800_000_000_000)
    return writer.getvalue()


async def exchange(
    storage: StorageProcess, requests: list[pb.AppendRequest]
) -> list[pb.AppendStreamResponse]:
    """Each request written after the previous one's answer came, on one stream."""
    async with grpc.aio.insecure_channel(storage.listen) as channel:
        call = pb_grpc.StorageStub(channel).AppendStream(None, timeout=RPC_TIMEOUT_S)
        answers = []
        for request in requests:
            await call.write(request)
            answer = await call.read()
            assert isinstance(answer, pb.AppendStreamResponse), answer
            answers.append(answer)
        await call.done_writing()
        assert await call.read() is EOF
        assert await call.code() is grpc.StatusCode.OK
        return answers


def test_answers_in_order_like_append(shared_storage: StorageProcess, topic_name: str) -> None:
    requests = [
        pb.AppendRequest(messages=[message(topic_name, 0, b"a"), message(topic_name, 1, b"b")]),
        pb.AppendRequest(records=[run_of(topic_name, b"c", b"d")]),
        pb.AppendRequest(messages=[message(topic_name, 0, b"e")]),
    ]
    answers = asyncio.run(exchange(shared_storage, requests))
    assert [answer.error_code for answer in answers] == [0, 0, 0]
    first, second, third = (answer.response for answer in answers)
    assert [r.queue_offset for r in first.results] == [0, 0]
    assert list(second.queue_offsets) == [1, 2]
    assert [r.queue_offset for r in third.results] == [3]
    offsets = [
        *(r.physical_offset for r in first.results),
        *second.physical_offsets,
        *(r.physical_offset for r in third.results),
    ]
    assert offsets == sorted(offsets) and len(set(offsets)) == 5
    unary = shared_storage.stub.Append(requests[1], timeout=RPC_TIMEOUT_S)
    assert list(unary.queue_offsets) == [4, 5]
    assert unary.msg_id_prefix == second.msg_id_prefix and second.status == pb.PUT_OK
    assert list(unary.sizes) == list(second.sizes)
    stored = shared_storage.read([(r.physical_offset, r.size) for r in first.results])
    assert [result.message.body for result in stored] == [b"a", b"b"]


def test_an_invalid_request_is_answered_in_band_and_the_stream_goes_on(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    bad_run = bytearray(run_of(topic_name, b"x", b"y"))
    bad_run[-1] ^= 0xFF  # the second record's body no longer matches its CRC
    bad = [
        pb.AppendRequest(records=[bytes(bad_run)]),
        pb.AppendRequest(messages=[message("bad topic!")]),
        pb.AppendRequest(),
        pb.AppendRequest(messages=[message(topic_name)] * 11),  # over --max-batch-messages
    ]
    good = pb.AppendRequest(messages=[message(topic_name, 0, b"fine")])
    requests = [item for request in bad for item in (request, good)]
    answers = asyncio.run(exchange(shared_storage, requests))
    for request, answer in zip(bad, answers[::2], strict=True):
        unary = expect_error(INVALID, partial(shared_storage.stub.Append, request, timeout=20))
        assert grpc.StatusCode.INVALID_ARGUMENT.value[0] == answer.error_code
        assert answer.error_message == unary  # the message Append gives
        assert not answer.HasField("response")
    assert "record" in answers[0].error_message and "1" in answers[0].error_message
    assert [answer.error_code for answer in answers[1::2]] == [0, 0, 0, 0]
    queue_offsets = [answer.response.results[0].queue_offset for answer in answers[1::2]]
    assert queue_offsets == [0, 1, 2, 3]  # nothing of the bad requests was written


def test_sigterm_ends_idle_append_streams(launcher: StorageLauncher, tmp_path: Path) -> None:
    storage = launcher.start(tmp_path / "store", "--shutdown-grace-s", "25")
    asyncio.run(_sigterm_ends_idle_append_streams(storage))


async def _sigterm_ends_idle_append_streams(storage: StorageProcess) -> None:
    async with grpc.aio.insecure_channel(storage.listen) as channel:
        call = pb_grpc.StorageStub(channel).AppendStream(None)
        await call.write(pb.AppendRequest(messages=[message("Streamed")]))
        answer = await call.read()
        assert isinstance(answer, pb.AppendStreamResponse) and not answer.error_code
        storage.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert await asyncio.wait_for(call.read(), 15) is EOF  # the idle stream ended
        assert await call.code() is grpc.StatusCode.OK
        code = await asyncio.to_thread(storage.wait_exit)
        assert time.monotonic() - started < 15, "an open AppendStream held the shutdown"
        assert code == 0, storage.describe()
    log = storage.stderr()
    assert "append stream from" in log and "ended after 1 appends" in log

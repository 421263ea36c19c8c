"""``Dispatch.GetQueueEntriesStream`` against real storage and dispatch processes: answers
in order equal to what ``GetQueueEntries`` gives, errors in-band with its code and message
(the stream goes on), idle streams end at shutdown."""

from __future__ import annotations

import asyncio
import signal
import time
from functools import partial
from pathlib import Path

import grpc

from tests.services.dispatch.conftest import RPC_TIMEOUT_S, DispatchLauncher, DispatchProcess, Pair
from tests.services.storage.conftest import StorageLauncher, message, rpc_error
from tide.format import tags_code
from tide.v1 import dispatch_pb2 as pb
from tide.v1 import dispatch_pb2_grpc as pb_grpc

EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)


def entries(
    topic: str, queue_id: int = 0, offset: int = 0, max_count: int = 32, *codes: int
) -> pb.GetQueueEntriesRequest:
    return pb.GetQueueEntriesRequest(
        topic=topic, queue_id=queue_id, offset=offset, max_count=max_count, tag_codes=codes
    )


async def exchange(
    address: str, requests: list[pb.GetQueueEntriesRequest]
) -> list[pb.GetQueueEntriesStreamResponse]:
    """Each request written after the previous one's answer came, on one stream."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.DispatchStub(channel).GetQueueEntriesStream(None, timeout=RPC_TIMEOUT_S)
        answers = []
        for request in requests:
            await call.write(request)
            answer = await call.read()
            assert isinstance(answer, pb.GetQueueEntriesStreamResponse), answer
            answers.append(answer)
        await call.done_writing()
        assert await call.read() is EOF
        assert await call.code() is grpc.StatusCode.OK
        return answers


def test_answers_equal_get_queue_entries_and_errors_are_in_band(
    shared_pair: Pair, topic_name: str
) -> None:
    tags = ["A" if i % 3 else "B" for i in range(8)]
    shared_pair.storage.append([message(topic_name, 0, tags=t) for t in tags])
    shared_pair.dispatch.wait_dispatched(shared_pair.storage.status().max_offset)
    good = [
        entries(topic_name),
        entries(topic_name, 0, 3, 2),
        entries(topic_name, 0, 0, 32, tags_code("B")),
        entries(topic_name, 0, 8),  # at the max offset: nothing new
    ]
    bad = [
        entries(topic_name, 5),  # nothing dispatched to the queue: NOT_FOUND
        entries(topic_name, 0, 9),  # OUT_OF_RANGE
        entries(topic_name, 0, 0, 0),  # INVALID_ARGUMENT
        entries("bad topic!"),
    ]
    requests = [bad[0], good[0], bad[1], good[1], bad[2], bad[3], good[2], good[3]]
    answers = asyncio.run(exchange(shared_pair.dispatch.listen, requests))
    stub = shared_pair.dispatch.stub
    codes = []
    for request, answer in zip(requests, answers, strict=True):
        if request in good:
            assert not answer.error_code
            assert answer.response == stub.GetQueueEntries(request, timeout=RPC_TIMEOUT_S)
            continue
        unary = rpc_error(partial(stub.GetQueueEntries, request, timeout=RPC_TIMEOUT_S))
        assert answer.error_code == unary.code().value[0]
        assert answer.error_message == unary.details()
        assert answer.error_message
        codes.append(unary.code())
    assert codes == [
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INVALID_ARGUMENT,
    ]
    assert [len(answers[i].response.entries) for i in (1, 3, 6, 7)] == [8, 2, 3, 0]


def test_sigterm_ends_idle_entries_streams(
    launchers: tuple[StorageLauncher, DispatchLauncher], tmp_path: Path
) -> None:
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen)
    asyncio.run(_sigterm_ends_idle_streams(dispatch))
    code = dispatch.wait_exit()
    assert code == 0, dispatch.describe()
    log = dispatch.stderr()
    assert "queue entries stream from" in log and "ended after 1 calls" in log


async def _sigterm_ends_idle_streams(dispatch: DispatchProcess) -> None:
    async with grpc.aio.insecure_channel(dispatch.listen) as channel:
        call = pb_grpc.DispatchStub(channel).GetQueueEntriesStream(None)
        await call.write(entries("T_none"))
        answer = await call.read()
        assert isinstance(answer, pb.GetQueueEntriesStreamResponse)
        assert answer.error_code == grpc.StatusCode.NOT_FOUND.value[0]
        dispatch.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert await asyncio.wait_for(call.read(), 15) is EOF  # the idle stream ended
        assert await call.code() is grpc.StatusCode.OK
        assert time.monotonic() - started < 15, "an open stream held the shutdown"


async def raw_exchange(address: str, requests: list[pb.GetQueueEntriesRequest]) -> list[bytes]:
    """The stream's answers as the bytes on the wire (no deserializer)."""
    async with grpc.aio.insecure_channel(address) as channel:
        method = channel.stream_stream(
            "/tide.v1.Dispatch/GetQueueEntriesStream",
            request_serializer=pb.GetQueueEntriesRequest.SerializeToString,
            response_deserializer=None,
        )
        call = method(None, timeout=RPC_TIMEOUT_S)
        answers = []
        for request in requests:
            await call.write(request)
            answer = await call.read()
            assert isinstance(answer, bytes), answer
            answers.append(answer)
        await call.done_writing()
        return answers


def spans_request(
    topic: str, *, records: bool = True, offset: int = 0, max_count: int = 1024
) -> pb.GetQueueEntriesRequest:
    return pb.GetQueueEntriesRequest(
        topic=topic, offset=offset, max_count=max_count, spans=True, records=records
    )


def test_answers_are_protobufs_bytes(shared_pair: Pair, topic_name: str) -> None:
    """The dispatch frames the stream's answers by hand (the records around the tail
    cache's views): byte for byte what protobuf writes for GetQueueEntries' answer in a
    GetQueueEntriesStreamResponse, with records held, several runs of them, spans only,
    one entry each, nothing new, and an error."""
    pair = shared_pair
    pair.storage.append([message(topic_name, 0, b"a" * n) for n in (1, 200, 3000)])
    pair.storage.append([message(topic_name, 1, b"other queue")])  # runs apart in queue 0
    # Records past 16 KiB: their length and the answer's take varints of 3 bytes.
    pair.storage.append([message(topic_name, 0, b"b" * 60_000) for _ in range(3)])
    pair.dispatch.wait_dispatched(pair.storage.status().max_offset)
    requests = [
        spans_request(topic_name),  # every record, in two runs: held by the tail cache
        spans_request(topic_name, offset=1, max_count=2),
        spans_request(topic_name, records=False),
        entries(topic_name),
        spans_request(topic_name, offset=6),  # nothing new
        spans_request(topic_name, offset=9),  # OUT_OF_RANGE, in-band
    ]
    answers = asyncio.run(raw_exchange(pair.dispatch.listen, requests))
    stub = pair.dispatch.stub
    for request, answer in zip(requests[:-1], answers, strict=False):
        unary = stub.GetQueueEntries(request, timeout=RPC_TIMEOUT_S)
        assert answer == pb.GetQueueEntriesStreamResponse(response=unary).SerializeToString()
    held = pb.GetQueueEntriesStreamResponse.FromString(answers[0]).response
    assert len(held.spans) == 2 and len(held.records) > 183_000
    error = pb.GetQueueEntriesStreamResponse.FromString(answers[-1])
    assert error.error_code == grpc.StatusCode.OUT_OF_RANGE.value[0] and error.error_message

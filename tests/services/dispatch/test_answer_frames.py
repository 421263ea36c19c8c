"""The dispatch's records answers framed by hand (answer_frames) are the bytes protobuf
writes for the same messages: an entries answer with and without records, a notice with
and without entries, at the lengths where a varint takes another byte; and the notices a
real dispatch sends are those bytes on the wire."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest

from services.dispatch.answer_frames import entries_parts, notice_frame
from tests.services.dispatch.conftest import RPC_TIMEOUT_S, Pair
from tests.services.dispatch.test_arrival_entries import wait_at
from tests.services.storage.conftest import message
from tide.v1 import dispatch_pb2 as pb

# Record lengths around the varint boundaries (1, 2 and 3 bytes) of the records' length
# and, with the entries' head, of the notice's entries length.
SIZES = [0, 1, 100, 127, 128, 16_383, 16_384, 70_000]


def _response(spans: int) -> pb.GetQueueEntriesResponse:
    response = pb.GetQueueEntriesResponse(next_offset=7 + spans, min_offset=3, max_offset=99)
    for i in range(spans):
        response.spans.add(physical_offset=1_000 * i, size=100 + i, count=1 + i)
    return response


def _views(size: int, pieces: int) -> list[memoryview]:
    data = os.urandom(size)
    cut = size // pieces
    bounds = [i * cut for i in range(pieces)] + [size]
    return [memoryview(data)[bounds[i] : bounds[i + 1]] for i in range(pieces)]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("pieces", [1, 3])
def test_entries_parts_are_protobufs_bytes(size: int, pieces: int) -> None:
    response = _response(spans=2)
    records = _views(size, pieces)
    expected = pb.GetQueueEntriesResponse()
    expected.CopyFrom(response)
    expected.records = b"".join(records)
    assert b"".join(entries_parts(response, records)) == expected.SerializeToString()
    assert b"".join(entries_parts(response, None)) == response.SerializeToString()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("entries_offset", [0, 5, 2**40])
def test_notice_frame_is_protobufs_bytes(size: int, entries_offset: int) -> None:
    notice = pb.ArrivalNotice(
        topic="tópico", queue_id=3, max_offset=2**33, entries_offset=entries_offset
    )
    response = _response(spans=1)
    records = _views(size, 2)
    expected = pb.ArrivalNotice()
    expected.CopyFrom(notice)
    expected.entries.CopyFrom(response)
    expected.entries.records = b"".join(records)
    framed = notice_frame(notice, entries_parts(response, records))
    assert framed == expected.SerializeToString()
    assert pb.ArrivalNotice.FromString(framed) == expected


def test_a_notice_without_entries_is_protobufs_bytes() -> None:
    notice = pb.ArrivalNotice(topic="T", queue_id=0, max_offset=1)
    assert notice_frame(notice, None) == notice.SerializeToString()
    # Entries present but empty (no spans, nothing looked at) still mark the field.
    empty = pb.ArrivalNotice(topic="T", queue_id=0, max_offset=1)
    empty.entries.SetInParent()
    framed = notice_frame(notice, entries_parts(pb.GetQueueEntriesResponse(), None))
    assert framed == empty.SerializeToString()
    assert pb.ArrivalNotice.FromString(framed).HasField("entries")


async def _raw_notices(address: str, topic: str, ready: asyncio.Event) -> list[bytes]:
    """A watch's notices on ``topic`` as the bytes on the wire, up to queue 1's first."""
    async with grpc.aio.insecure_channel(address) as channel:
        method = channel.unary_stream(
            "/tide.v1.Dispatch/WatchArrivals",
            request_serializer=pb.WatchArrivalsRequest.SerializeToString,
            response_deserializer=None,
        )
        request = pb.WatchArrivalsRequest(topics=[topic], send_current=True, entries_max_count=64)
        call = method(request, timeout=RPC_TIMEOUT_S)
        notices: list[bytes] = []
        async for notice in call:
            assert isinstance(notice, bytes), notice
            notices.append(notice)
            ready.set()
            if pb.ArrivalNotice.FromString(notice).queue_id == 1:
                break
        call.cancel()
        return notices


def test_notices_on_the_wire_are_protobufs_bytes(shared_pair: Pair, topic_name: str) -> None:
    """A notice with entries (records of 1, 200 and 60,000 bytes: 3-byte varints) and
    one without, as a real dispatch sends them."""
    pair = shared_pair
    pair.storage.append([message(topic_name, 0, b"first")])
    pair.dispatch.wait_dispatched(pair.storage.status().max_offset)

    async def watch_and_append() -> list[bytes]:
        ready = asyncio.Event()
        watching = asyncio.create_task(_raw_notices(pair.dispatch.listen, topic_name, ready))
        await ready.wait()  # the current notice came: the watch announced offset 1
        await asyncio.to_thread(wait_at, pair, topic_name, 1)
        bodies = [b"a", b"b" * 200, b"c" * 60_000]
        await asyncio.to_thread(
            pair.storage.append, [message(topic_name, 0, body) for body in bodies]
        )
        await asyncio.to_thread(pair.storage.append, [message(topic_name, 1, b"no reader")])
        return await watching

    raw = asyncio.run(watch_and_append())
    notices = [pb.ArrivalNotice.FromString(data) for data in raw]
    for data, notice in zip(raw, notices, strict=True):
        assert notice.SerializeToString() == data
    current, *carried, other = notices
    assert (current.queue_id, current.max_offset) == (0, 1)
    # Queue 0's appended records, in one notice unless the Tail cut them apart.
    announced = current.max_offset
    for notice in carried:
        assert notice.queue_id == 0 and notice.entries_offset == announced
        announced = notice.max_offset
    assert announced == 4
    assert sum(len(notice.entries.records) for notice in carried) > 60_000
    assert (other.queue_id, other.max_offset) == (1, 1) and not other.HasField("entries")

"""ProduceStream's packed answers (services/gateway/produce_stream.py), in one process:
which answers ride in an earlier answer's ``next``, in what order, and that every
request's slot comes back. The stream end to end: test_produce_stream.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable

import grpc

from services.gateway.produce_stream import (
    MAX_PACKED_ANSWER_BYTES,
    MAX_PACKED_ANSWERS,
    MAX_PRODUCE_STREAM_IN_FLIGHT,
    _answers,
    _cancel_outstanding,
    _Stream,
)
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb

Answers = list[pb.ProduceStreamResponse]


def response(count: int) -> pb.ProduceResponse:
    return pb.ProduceResponse(results=[pb.ProduceResult(queue_offset=i) for i in range(count)])


async def answered(count: int) -> pb.ProduceResponse:
    return response(count)


async def answered_big() -> pb.ProduceResponse:
    """A result per message of a 1,000-message request, ids and all (~80 KB)."""
    ids = [f"{i:032X}" for i in range(1_000)]
    return pb.ProduceResponse(
        results=[
            pb.ProduceResult(msg_id=i, unique_key=i, broker_name="broker-a", queue_offset=n)
            for n, i in enumerate(ids)
        ]
    )


async def refused() -> pb.ProduceResponse:
    raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "messages[0].topic is empty")


def run(scenario: Callable[[_Stream], Awaitable[Answers]]) -> tuple[Answers, _Stream]:
    stream = _Stream(1 << 20)

    async def main() -> Answers:
        return await scenario(stream)

    return asyncio.run(main()), stream


async def start(
    stream: _Stream, work: Awaitable[pb.ProduceResponse], *, pack: bool
) -> asyncio.Task[pb.ProduceResponse]:
    """Queue a request's task as the reader does: a slot taken, packable if asked."""
    await stream.slots.acquire()
    task = asyncio.ensure_future(work)
    if pack:
        stream.packable.add(task)
    stream.queue.put_nowait(task)
    return task


async def collect(stream: _Stream) -> Answers:
    return [answer async for answer in _answers(stream)]


def slots_free(stream: _Stream) -> int:
    """How many slots can be taken at once (public API only: locked() after each)."""

    async def count() -> int:
        taken = 0
        while not stream.slots.locked():
            await stream.slots.acquire()
            taken += 1
        return taken

    return asyncio.run(count())


def flatten(messages: Answers) -> Answers:
    return [answer for message in messages for answer in (message, *message.next)]


def test_ready_answers_of_packable_requests_ride_in_the_first() -> None:
    async def scenario(stream: _Stream) -> Answers:
        for count in (1, 2, 3):
            await start(stream, answered(count), pack=True)
        await start(stream, refused(), pack=True)  # an error rides along as it is
        await asyncio.sleep(0)  # every task runs to its end
        stream.queue.put_nowait(None)  # the client half-closed
        return await collect(stream)

    messages, stream = run(scenario)
    assert len(messages) == 1
    (first,) = messages
    assert len(first.response.results) == 1
    assert [len(a.response.results) for a in first.next] == [2, 3, 0]
    assert [a.error_code for a in flatten(messages)] == [0, 0, 0, 3]
    assert first.next[2].error_message == "messages[0].topic is empty"
    assert all(not a.next for a in first.next)  # one level only
    assert slots_free(stream) == MAX_PRODUCE_STREAM_IN_FLIGHT
    assert not stream.packable


def test_a_request_without_the_flag_is_never_packed_nor_those_after_it() -> None:
    async def scenario(stream: _Stream) -> Answers:
        await start(stream, answered(1), pack=True)
        await start(stream, answered(2), pack=True)
        await start(stream, answered(3), pack=False)  # an old client's request
        await start(stream, answered(4), pack=True)
        await asyncio.sleep(0)
        stream.queue.put_nowait(None)
        return await collect(stream)

    messages, stream = run(scenario)
    shape = [
        [len(m.response.results)] + [len(a.response.results) for a in m.next] for m in messages
    ]
    assert shape == [[1, 2], [3, 4]]
    assert slots_free(stream) == MAX_PRODUCE_STREAM_IN_FLIGHT


def test_an_answer_not_ready_is_not_waited_for_it_goes_in_its_own_message() -> None:
    async def scenario(stream: _Stream) -> Answers:
        release = asyncio.Event()

        async def slow() -> pb.ProduceResponse:
            await release.wait()
            return response(5)

        await start(stream, answered(1), pack=True)
        await start(stream, slow(), pack=True)
        await start(stream, answered(6), pack=True)
        await asyncio.sleep(0)
        answers = _answers(stream)
        first = await anext(answers)  # written while the second still runs
        release.set()
        stream.queue.put_nowait(None)
        return [first] + [answer async for answer in answers]

    messages, stream = run(scenario)
    shape = [
        [len(m.response.results)] + [len(a.response.results) for a in m.next] for m in messages
    ]
    assert shape == [[1], [5, 6]]
    assert slots_free(stream) == MAX_PRODUCE_STREAM_IN_FLIGHT


def test_at_most_max_packed_answers_ride_in_one_message() -> None:
    total = MAX_PACKED_ANSWERS + 1 + 3

    async def scenario(stream: _Stream) -> Answers:
        stream.slots = asyncio.Semaphore(total)
        for index in range(total):
            await start(stream, answered(index + 1), pack=True)
        await asyncio.sleep(0)
        stream.queue.put_nowait(None)
        return await collect(stream)

    messages, _ = run(scenario)
    assert [len(m.next) for m in messages] == [MAX_PACKED_ANSWERS, 2]
    assert [len(a.response.results) for a in flatten(messages)] == list(range(1, total + 1))


def test_packed_answers_stop_at_their_byte_bound() -> None:
    """Answers with a result per message of big requests: as many as fit in
    MAX_PACKED_ANSWER_BYTES ride along, the next one starts a message of its own."""
    per_answer = pb.ProduceStreamResponse(response=asyncio.run(answered_big())).ByteSize()
    fit = MAX_PACKED_ANSWER_BYTES // per_answer
    assert 1 <= fit < MAX_PACKED_ANSWERS - 2
    total = fit + 3

    async def scenario(stream: _Stream) -> Answers:
        for _ in range(total):
            await start(stream, answered_big(), pack=True)
        await asyncio.sleep(0)
        stream.queue.put_nowait(None)
        return await collect(stream)

    messages, stream = run(scenario)
    assert [len(m.next) for m in messages] == [fit, 1]
    assert sum(m.ByteSize() for m in messages[0].next) <= MAX_PACKED_ANSWER_BYTES
    assert slots_free(stream) == MAX_PRODUCE_STREAM_IN_FLIGHT


def test_the_end_marker_met_while_packing_still_ends_the_stream() -> None:
    async def scenario(stream: _Stream) -> Answers:
        await start(stream, answered(1), pack=True)
        await start(stream, answered(2), pack=True)
        stream.queue.put_nowait(None)
        await asyncio.sleep(0)
        return await asyncio.wait_for(collect(stream), timeout=10)

    messages, _ = run(scenario)
    assert [len(m.next) for m in messages] == [1]


def test_a_carried_request_is_cancelled_with_the_stream() -> None:
    async def scenario(stream: _Stream) -> Answers:
        never = asyncio.Event()

        async def stuck() -> pb.ProduceResponse:
            await never.wait()
            return response(1)

        await start(stream, answered(1), pack=True)
        carried = await start(stream, stuck(), pack=True)
        await asyncio.sleep(0)
        answers = _answers(stream)
        first = await anext(answers)  # takes the stuck one off the queue: carried
        assert stream.carried is carried and stream.queue.empty()
        assert isinstance(answers, AsyncGenerator)
        await answers.aclose()
        await _cancel_outstanding(stream)
        assert carried.cancelled()
        return [first]

    messages, _ = run(scenario)
    assert len(messages) == 1 and not messages[0].next

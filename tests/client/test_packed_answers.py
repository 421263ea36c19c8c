"""The clients' ProduceStream reads packed answers (``ProduceStreamResponse.next``):
against a stand-in gateway that reads a number of requests, checks each asked for
packing, and answers them all in one stream message."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from tide.client import Message, Producer
from tide.client._produce_stream import answers_in
from tide.client.aio import Producer as AioProducer
from tide.v1 import gateway_pb2 as pb

SENDS = 5
RESULT_TIMEOUT_S = 30.0


def answer(request: pb.ProduceRequest, index: int) -> pb.ProduceStreamResponse:
    if request.messages[0].body == b"refuse":
        return pb.ProduceStreamResponse(error_code=3, error_message="messages[0] refused here")
    results = [
        pb.ProduceResult(
            msg_id=f"{index:02d}{position:030d}",
            unique_key=f"{index:02d}{position:030d}",
            broker_name="broker-a",
            queue_id=index,
            queue_offset=position,
        )
        for position in range(len(request.messages))
    ]
    return pb.ProduceStreamResponse(response=pb.ProduceResponse(results=results))


def produce_stream(requests: Iterator[pb.ProduceRequest], context: Any) -> Iterator[Any]:
    """Answers every SENDS requests in one message: the first's answer, the rest in next."""
    batch: list[pb.ProduceRequest] = []
    for request in requests:
        assert request.pack_answers, "a client request did not ask for packed answers"
        batch.append(request)
        if len(batch) == SENDS:
            first, *rest = (answer(sent, index) for index, sent in enumerate(batch))
            first.next.extend(rest)
            yield first
            batch = []


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.stream_stream_rpc_method_handler(
        produce_stream,
        request_deserializer=pb.ProduceRequest.FromString,
        response_serializer=pb.ProduceStreamResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("tide.v1.Gateway", {"ProduceStream": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def batches() -> list[list[Message]]:
    bodies = ["a", "b", "refuse", "c", "d"]
    return [[Message("T", body)] * (1 + index) for index, body in enumerate(bodies)]


def check(outcomes: list[Any]) -> None:
    """Each send got its own answer: its queue is its position among the five."""
    for index, outcome in enumerate(outcomes):
        if index == 2:
            assert isinstance(outcome, Exception) and "refused here" in str(outcome)
            continue
        assert not isinstance(outcome, Exception), outcome
        assert [result.queue.queue_id for result in outcome] == [index] * (1 + index)
        assert [result.queue_offset for result in outcome] == list(range(1 + index))


def test_the_sync_producer_reads_packed_answers(gateway: str) -> None:
    with Producer(gateway, stream=True, max_in_flight=SENDS) as producer:
        sent = [producer.send_batch_async(batch) for batch in batches()]
        outcomes: list[Any] = []
        for future in sent:
            try:
                outcomes.append(future.result(timeout=RESULT_TIMEOUT_S))
            except Exception as exc:
                outcomes.append(exc)
    check(outcomes)


def test_the_asyncio_producer_reads_packed_answers(gateway: str) -> None:
    async def main() -> list[Any]:
        async with AioProducer(gateway, stream=True, max_in_flight=SENDS) as producer:
            sent = [await producer.send_batch_async(batch) for batch in batches()]
            return list(await asyncio.gather(*sent, return_exceptions=True))

    check(asyncio.run(main()))


def test_answers_in_gives_the_message_then_its_next_in_order() -> None:
    alone = pb.ProduceStreamResponse(error_code=5)
    assert answers_in(alone) == [alone]
    packed = pb.ProduceStreamResponse(error_code=0)
    packed.next.add(error_code=3)
    packed.next.add(error_code=4)
    assert [a.error_code for a in answers_in(packed)] == [0, 3, 4]

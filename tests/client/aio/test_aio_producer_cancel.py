"""tide.client.aio Producer: cancellation, backpressure and event-loop shutdown, against
a real cluster (docs/client.md, "The asyncio client")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tests._cluster import Cluster
from tide.client import MessageQueue, ResourceExhausted, SendResult, Unavailable
from tide.client.aio import Delivery, Producer, PullConsumer, cancelled_delivery
from tide.v1 import gateway_pb2

LONG_LINGER_MS = 60_000
# The most event-loop turns a test yields for a state the loop reaches within a few.
MAX_TURNS = 1_000

Carrier = Callable[[gateway_pb2.ProduceRequest, str], Awaitable[gateway_pb2.ProduceResponse]]


async def turns_until(condition: Callable[[], bool], what: str) -> None:
    """Yield to the loop until ``condition`` holds (bounded: the loop alone gets there)."""
    for _ in range(MAX_TURNS):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not within {MAX_TURNS} loop turns: {what}")


class Gate:
    """Wraps the producer's carrier: each Produce call starts (really, on the channel)
    and says so; its answer is passed on only once the gate opens."""

    def __init__(self, producer: Producer) -> None:
        self.started = asyncio.Event()
        self.opened = asyncio.Event()
        self._carry: Carrier = producer._accumulator._carry
        producer._accumulator._carry = self

    async def __call__(
        self, request: gateway_pb2.ProduceRequest, what: str
    ) -> gateway_pb2.ProduceResponse:
        call = asyncio.ensure_future(self._carry(request, what))
        self.started.set()
        await self.opened.wait()
        return await call


async def stored(gateway: str, queue: MessageQueue) -> list[bytes]:
    async with PullConsumer("G_aio_cancel", gateway) as consumer:
        result = await consumer.pull(queue, 0, max_messages=100)
        return [m.body for m in result.messages]


def test_a_send_cancelled_before_its_batch_left_is_not_sent(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_aio_withdrawn", queues=1, brokers=["broker-a"])

    async def run() -> None:
        async with Producer(gateway, linger_ms=LONG_LINGER_MS) as producer:
            send = asyncio.create_task(producer.send("T_aio_withdrawn", b"withdrawn"))
            await turns_until(lambda: producer.in_flight[0] == 1, "the message accumulated")
            send.cancel()
            with pytest.raises(asyncio.CancelledError) as caught:
                await send
            assert cancelled_delivery(caught.value) is None  # withdrawn
            assert producer.in_flight == (0, 0)  # its room is given back
            after = await producer.send_async("T_aio_withdrawn", b"after")
        # Closing sent "after" alone, first in the queue: the cancelled one never went.
        assert after.result().queue_offset == 0
        assert producer._accumulator.messages_sent == 1

    asyncio.run(run())


def test_a_send_cancelled_while_its_call_is_in_flight_is_reported(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_aio_in_flight", queues=1, brokers=["broker-b"])
    queue = MessageQueue("T_aio_in_flight", "broker-b", 0)

    async def run() -> None:
        async with Producer(gateway, linger_ms=0) as producer:
            gate = Gate(producer)
            send = asyncio.create_task(producer.send("T_aio_in_flight", b"in flight"))
            other = asyncio.create_task(producer.send("T_aio_in_flight", b"same batch"))
            await gate.started.wait()
            send.cancel()
            with pytest.raises(asyncio.CancelledError) as caught:
                await send
            delivery = cancelled_delivery(caught.value)
            assert isinstance(delivery, Delivery) and delivery.sent
            assert not delivery.cancel()  # its call was made: no withdrawing now
            gate.opened.set()
            result = await delivery  # the outcome, delivered all the same
            assert isinstance(result, SendResult) and result.written
            assert {(await other).queue_offset, result.queue_offset} == {0, 1}
        # Stored exactly once, and the other send of its batch (or of the next) too.
        assert sorted(await stored(gateway, queue)) == [b"in flight", b"same batch"]

    asyncio.run(run())
    # A timeout around the send (asyncio.timeout) finds the delivery too.

    async def timed_out() -> None:
        async with Producer(gateway, linger_ms=0) as producer:
            gate = Gate(producer)
            with pytest.raises(TimeoutError) as caught:
                async with asyncio.timeout(0):
                    await producer.send("T_aio_in_flight", b"timed out")
            # The sender took the batch (linger 0) before the timeout's cancel landed.
            delivery = cancelled_delivery(caught.value)
            assert isinstance(delivery, Delivery) and delivery.sent
            gate.opened.set()
            assert (await delivery).written

    asyncio.run(timed_out())


def test_send_waits_for_room_rather_than_queueing(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_aio_room", queues=1, brokers=["broker-a"])

    async def run() -> None:
        producer = Producer(
            gateway, linger_ms=LONG_LINGER_MS, max_in_flight=2, rpc_timeout_ms=2_000
        )
        first = await producer.send_async("T_aio_room", b"1")
        await producer.send_async("T_aio_room", b"2")
        third = asyncio.create_task(producer.send_async("T_aio_room", b"3"))
        await turns_until(lambda: producer.in_flight[0] == 2, "two in flight")
        for _ in range(10):  # the loop turns; the third send still waits for room
            await asyncio.sleep(0)
        assert not third.done() and producer.in_flight[0] == 2
        assert first.cancel()  # withdrawn: its room goes to the third
        await asyncio.wait_for(third, 5)
        assert producer.in_flight[0] == 2
        # Nothing finishes within the RPC timeout: ResourceExhausted, naming the bound.
        with pytest.raises(ResourceExhausted, match="max_in_flight 2"):
            await producer.send("T_aio_room", b"4")
        await producer.close()
        assert (await third).result().written

    asyncio.run(run())


def test_the_loop_ending_under_open_sends_fails_them_clearly(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    cluster.create_topic("T_aio_loop_end", queues=1, brokers=["broker-a"])
    deliveries: list[Delivery] = []

    async def accumulated() -> None:  # returns with the producer open, a batch lingering
        producer = Producer(gateway, linger_ms=LONG_LINGER_MS)
        deliveries.append(await producer.send_async("T_aio_loop_end", b"lingering"))

    async def in_flight() -> None:  # returns while a call waits for its answer
        producer = Producer(gateway, linger_ms=0)
        gate = Gate(producer)
        deliveries.append(await producer.send_async("T_aio_loop_end", b"in flight"))
        await gate.started.wait()

    asyncio.run(accumulated())
    asyncio.run(in_flight())
    lingering, sent = deliveries
    assert lingering.done() and not lingering.sent
    assert isinstance(lingering.exception(), Unavailable)
    assert "event loop stopped" in str(lingering.exception())
    assert sent.done() and sent.sent
    assert isinstance(sent.exception(), Unavailable)
    assert "stored or not" in str(sent.exception())


def test_close_gives_up_on_an_answer_that_never_comes(cluster: Cluster) -> None:
    """close() waits for the answers only up to its close timeout (the sends' retries
    and a little, shortened here): past it, what is unanswered fails with Unavailable
    and close returns rather than hang on a gateway that never answers (the Gate holds
    the answer forever)."""
    gateway = cluster.gateway.listen
    cluster.create_topic("T_aio_unanswered", queues=1, brokers=["broker-a"])

    async def run() -> None:
        producer = Producer(gateway, linger_ms=0)
        producer._close_timeout_s = 0.2  # instead of the retries' ~ 10 s
        gate = Gate(producer)
        send = asyncio.create_task(producer.send("T_aio_unanswered", b"unanswered"))
        await gate.started.wait()
        await producer.close()
        with pytest.raises(Unavailable):
            await send
        assert producer.in_flight == (0, 0)
        assert not gate.opened.is_set()

    asyncio.run(run())

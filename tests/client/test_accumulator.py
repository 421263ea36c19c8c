"""The accumulator's bookkeeping with a carrier that answers as a gateway would in the
cases a running cluster does not produce on demand: a call that wrote some messages and
not others, a call that fails outright. (Against real processes:
test_producer_batching.py.)"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import grpc
import pytest

from tests.client._accumulators import accumulator
from tide.client import Message, SendResult, TideError, Unavailable
from tide.client._accumulator import Accumulator
from tide.client._convert import to_produce_message
from tide.v1 import gateway_pb2

RESULT_TIMEOUT_S = 10.0


Answer = Callable[[gateway_pb2.ProduceRequest], gateway_pb2.ProduceResponse | BaseException]


class Gateway:
    """Answers each request with ``answer(request)`` (a response or an exception)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[gateway_pb2.ProduceRequest] = []

    def __call__(
        self, request: gateway_pb2.ProduceRequest, what: str
    ) -> Future[gateway_pb2.ProduceResponse]:
        self.requests.append(request)
        future: Future[gateway_pb2.ProduceResponse] = Future()
        answer = self.answer(request)
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)
        return future


def send(acc: Accumulator, topic: str, count: int) -> list[Future[SendResult]]:
    messages = [Message(topic, f"m{i}") for i in range(count)]
    return [acc.add(message.topic, to_produce_message(message)) for message in messages]


def partly_written(request: gateway_pb2.ProduceRequest) -> gateway_pb2.ProduceResponse:
    """The first two written to broker-a queue 1, the third refused by its broker."""
    assert len(request.messages) == 3
    return gateway_pb2.ProduceResponse(
        runs=[
            gateway_pb2.ProduceRun(
                first_index=0,
                count=2,
                broker_name="broker-a",
                queue_id=1,
                first_queue_offset=40,
                msg_id_prefix="7F00000100002A9F",
                physical_offsets=[100, 200],
                unique_keys=["u0", "u1"],
            ),
            gateway_pb2.ProduceRun(
                first_index=2,
                count=1,
                status=gateway_pb2.ProduceResult.SEND_FAILED,
                broker_name="broker-b",
                unique_keys=["u2"],
                error="broker-b: the disk is full",
            ),
        ]
    )


def test_a_partly_written_call_gives_each_message_its_own_outcome() -> None:
    gateway = Gateway(partly_written)
    acc, in_flight = accumulator(gateway, batch_max_messages=3)
    first, second, third = send(acc, "T", 3)  # full: one call
    a, b = first.result(RESULT_TIMEOUT_S), second.result(RESULT_TIMEOUT_S)
    assert (a.queue_offset, a.unique_key, b.queue_offset, b.unique_key) == (40, "u0", 41, "u1")
    assert a.msg_id.endswith("0000000000000064") and b.msg_id.endswith("00000000000000C8")
    with pytest.raises(TideError, match="broker-b: the disk is full"):
        third.result(RESULT_TIMEOUT_S)
    assert len(gateway.requests) == 1
    acc.close()
    assert in_flight.sends == 0 and in_flight.bytes == 0


def test_a_failed_call_fails_each_of_its_messages_with_the_cause() -> None:
    cause = Unavailable(
        "Produce to 'T' failed: every broker is unreachable", grpc.StatusCode.UNAVAILABLE
    )
    gateway = Gateway(lambda _: cause)
    acc, in_flight = accumulator(gateway, batch_max_messages=4)
    futures = send(acc, "T", 4)
    for future in futures:
        assert future.exception(RESULT_TIMEOUT_S) is cause
    assert len(gateway.requests) == 1  # not split: the cause is not about one message
    acc.close()
    assert in_flight.sends == 0


def test_a_refusal_naming_one_message_is_resent_message_by_message() -> None:
    def refuse_the_second(
        request: gateway_pb2.ProduceRequest,
    ) -> gateway_pb2.ProduceResponse | BaseException:
        bodies = [m.body for m in request.messages]
        if b"m1" in bodies:
            index = bodies.index(b"m1")
            return TideError(
                f"Produce to 'T' failed: messages[{index}].tags: bad",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        return partly_written_single(request)

    gateway = Gateway(refuse_the_second)
    acc, _ = accumulator(gateway, batch_max_messages=3)
    futures = send(acc, "T", 3)
    assert futures[0].result(RESULT_TIMEOUT_S).queue_offset == 7
    with pytest.raises(TideError, match=r"messages\[0\]\.tags: bad"):  # as if sent alone
        futures[1].result(RESULT_TIMEOUT_S)
    assert futures[2].result(RESULT_TIMEOUT_S).queue_offset == 7
    assert [len(r.messages) for r in gateway.requests] == [3, 1, 1, 1]
    acc.close()


def partly_written_single(request: gateway_pb2.ProduceRequest) -> gateway_pb2.ProduceResponse:
    assert len(request.messages) == 1
    return gateway_pb2.ProduceResponse(
        runs=[
            gateway_pb2.ProduceRun(
                first_index=0,
                count=1,
                broker_name="broker-a",
                queue_id=0,
                first_queue_offset=7,
                msg_id_prefix="7F00000100002A9F",
                physical_offsets=[1],
                unique_keys=["u"],
            )
        ]
    )


def written(request: gateway_pb2.ProduceRequest) -> gateway_pb2.ProduceResponse:
    """Every message of the call written to broker-a queue 0, from offset 0."""
    count = len(request.messages)
    return gateway_pb2.ProduceResponse(
        runs=[
            gateway_pb2.ProduceRun(
                first_index=0,
                count=count,
                broker_name="broker-a",
                queue_id=0,
                first_queue_offset=0,
                msg_id_prefix="7F00000100002A9F",
                physical_offsets=list(range(count)),
                unique_keys=[f"u{i}" for i in range(count)],
            )
        ]
    )


def add_synced(acc: Accumulator, body: str) -> Future[SendResult]:
    message = Message("T", body)
    return acc.add(message.topic, to_produce_message(message), synced=True)


def test_sync_sends_go_together_once_none_is_on_its_way() -> None:
    """Blocking send()s do not wait out the linger (60 s here) once every send() under
    way waits in the batch; until then the batch waits for the one on its way."""
    gateway = Gateway(written)
    acc, in_flight = accumulator(gateway, batch_max_messages=100)
    with acc.sync_send(), acc.sync_send():  # two callers of send() under way
        first = add_synced(acc, "first")
        assert not first.done()  # the other send() is on its way: its batch waits
        second = add_synced(acc, "second")
        first.result(RESULT_TIMEOUT_S)
        second.result(RESULT_TIMEOUT_S)
    assert [len(r.messages) for r in gateway.requests] == [2]
    acc.close()
    assert in_flight.sends == 0


def test_a_sync_send_that_leaves_releases_the_batch() -> None:
    """A send() that ends without adding (its message refused, say) is no longer waited
    for: the batch of the others goes."""
    gateway = Gateway(written)
    acc, _ = accumulator(gateway, batch_max_messages=100)
    with acc.sync_send():
        leaving = acc.sync_send()
        leaving.__enter__()
        waiting = add_synced(acc, "waiting")
        assert not waiting.done()
        leaving.__exit__(None, None, None)
        assert waiting.result(RESULT_TIMEOUT_S).written
    assert [len(r.messages) for r in gateway.requests] == [1]
    acc.close()


def test_async_sends_linger_and_do_not_wake_the_sender_per_message() -> None:
    """send_async() has no caller waiting: its batch lingers. Adding to an open batch
    does not wake the sender (it used to, once per message, to find nothing to do)."""
    gateway = Gateway(written)
    acc, _ = accumulator(gateway, batch_max_messages=1000)
    futures = send(acc, "T", 200)
    assert not any(f.done() for f in futures)
    assert acc.sender_wakeups <= 2  # its start, and its 1 s bound on a wait at most
    acc.close()  # sends what lingers
    assert all(f.result(RESULT_TIMEOUT_S).written for f in futures)
    assert [len(r.messages) for r in gateway.requests] == [200]

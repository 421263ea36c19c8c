"""Blocking sends (``Producer.send``) wait on a lock their batch's answer releases, not
on a Future: each caller still gets its own message's exact result or error, a failed
call fails every waiting caller with its cause, and closing answers callers that wait.
The callers of one answer are woken in a chain (each wakes the next); one interrupted
while it waits does not stop the chain."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

import grpc
import pytest

from tests.client._accumulators import accumulator
from tide.client import Message, SendResult, TideError, Unavailable
from tide.client._accumulator import Accumulator, _Entry, _wake
from tide.client._convert import plain_produce_message, to_produce_message
from tide.v1 import gateway_pb2
from tide.waiting import wait_until

RESULT_TIMEOUT_S = 10.0
THREADS = 16
SENDS_PER_THREAD = 25

Answer = Callable[[gateway_pb2.ProduceRequest], gateway_pb2.ProduceResponse]


def each_written(request: gateway_pb2.ProduceRequest) -> gateway_pb2.ProduceResponse:
    """Every message written to queue 0 at the offset of its place in the call, except
    those whose body starts with "bad": each of them refused with its body in the error."""
    runs = []
    for i, produce in enumerate(request.messages):
        body = produce.body.decode()
        if body.startswith("bad"):
            runs.append(
                gateway_pb2.ProduceRun(
                    first_index=i,
                    count=1,
                    status=gateway_pb2.ProduceResult.SEND_FAILED,
                    broker_name="broker-a",
                    unique_keys=[f"k-{body}"],
                    error=f"refused {body}",
                )
            )
        else:
            runs.append(
                gateway_pb2.ProduceRun(
                    first_index=i,
                    count=1,
                    broker_name="broker-a",
                    queue_id=0,
                    first_queue_offset=i,
                    msg_id_prefix="7F00000100002A9F",
                    physical_offsets=[i],
                    unique_keys=[f"k-{body}"],
                )
            )
    return gateway_pb2.ProduceResponse(runs=runs)


class Gateway:
    """Answers each call on its own thread (as the producer's call threads do)."""

    def __init__(self, answer: Answer | BaseException) -> None:
        self.answer = answer
        self.calls = 0

    def __call__(
        self, request: gateway_pb2.ProduceRequest, what: str
    ) -> Future[gateway_pb2.ProduceResponse]:
        self.calls += 1
        future: Future[gateway_pb2.ProduceResponse] = Future()

        def answer() -> None:
            if isinstance(self.answer, BaseException):
                future.set_exception(self.answer)
            else:
                future.set_result(self.answer(request))

        threading.Thread(target=answer).start()
        return future


def blocking_send(acc: Accumulator, body: str) -> SendResult:
    with acc.sync_send():
        message = Message("T", body)
        return acc.send(message.topic, to_produce_message(message))


def in_threads(count: int, work: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RESULT_TIMEOUT_S)
    assert not any(thread.is_alive() for thread in threads)


def test_many_threads_each_get_their_own_result_and_error() -> None:
    acc, in_flight = accumulator(Gateway(each_written), batch_max_messages=256)
    outcomes: dict[str, SendResult | BaseException] = {}

    def work(thread: int) -> None:
        for n in range(SENDS_PER_THREAD):
            body = f"{'bad' if n % 5 == 0 else 'ok'}-{thread}-{n}"
            try:
                outcomes[body] = blocking_send(acc, body)
            except TideError as exc:
                outcomes[body] = exc

    in_threads(THREADS, work)
    assert len(outcomes) == THREADS * SENDS_PER_THREAD
    for body, outcome in outcomes.items():
        if body.startswith("bad"):
            assert isinstance(outcome, TideError) and f"refused {body}" in str(outcome)
        else:
            assert isinstance(outcome, SendResult) and outcome.unique_key == f"k-{body}"
    assert acc.calls_sent < THREADS * SENDS_PER_THREAD  # they shared calls
    acc.close()
    assert in_flight.sends == 0 and in_flight.bytes == 0


def test_a_failed_call_fails_every_waiting_caller_with_the_cause() -> None:
    cause = Unavailable("Produce to 'T' failed: no broker", grpc.StatusCode.UNAVAILABLE)
    gateway = Gateway(cause)
    acc, in_flight = accumulator(gateway, batch_max_messages=256)
    raised: list[BaseException] = []

    def work(thread: int) -> None:
        with pytest.raises(Unavailable) as caught:
            blocking_send(acc, f"m{thread}")
        raised.append(caught.value)

    in_threads(8, work)
    assert len(raised) == 8 and all(error is cause for error in raised)
    acc.close()
    assert in_flight.sends == 0 and in_flight.bytes == 0


def test_a_carrier_closed_under_the_batch_fails_its_callers() -> None:
    def closed(
        request: gateway_pb2.ProduceRequest, what: str
    ) -> Future[gateway_pb2.ProduceResponse]:
        raise TideError("the producer is closed")

    acc, in_flight = accumulator(closed, batch_max_messages=256)
    with pytest.raises(TideError, match="the producer is closed"):
        blocking_send(acc, "m")
    acc.close()
    assert in_flight.sends == 0


def test_closing_sends_the_batch_callers_wait_in() -> None:
    """Callers wait in a lingering batch (another send() is on its way); closing sends
    it at once and each caller gets its result."""
    acc, in_flight = accumulator(Gateway(each_written), batch_max_messages=256)
    results: dict[int, SendResult] = {}
    with acc.sync_send():  # a send() on its way: the batch lingers (60 s)

        def work(thread: int) -> None:
            results[thread] = blocking_send(acc, f"ok-{thread}")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        wait_until(
            lambda: acc._batches.sync_open == 4, "4 sends waiting in the batch", RESULT_TIMEOUT_S
        )
        assert not results
        acc.close()
        for thread in threads:
            thread.join(RESULT_TIMEOUT_S)
    assert {t: r.unique_key for t, r in results.items()} == {t: f"k-ok-{t}" for t in range(4)}
    assert in_flight.sends == 0


def test_a_send_after_close_is_refused_and_frees_its_room() -> None:
    acc, in_flight = accumulator(Gateway(each_written), batch_max_messages=256)
    acc.close()
    with pytest.raises(TideError, match="closed"):
        blocking_send(acc, "late")
    assert in_flight.sends == 0 and in_flight.bytes == 0


class _InterruptedLock:
    """A blocking send's lock whose blocking acquire is interrupted (as KeyboardInterrupt
    interrupts the main thread's wait); the rest is the real lock's."""

    def __init__(self, lock: object) -> None:
        self._lock = lock

    def acquire(self, blocking: bool = True) -> bool:
        if blocking:
            raise KeyboardInterrupt
        return self._lock.acquire(blocking=False)  # type: ignore[attr-defined, no-any-return]

    def release(self) -> None:
        self._lock.release()  # type: ignore[attr-defined]

    def locked(self) -> bool:
        return self._lock.locked()  # type: ignore[attr-defined, no-any-return]


def _chain(count: int) -> list[_Entry]:
    """``count`` answered blocking sends chained in order, none woken yet."""
    entries = [_Entry("T", plain_produce_message("T", b"x"), blocking=True) for _ in range(count)]
    for i, entry in enumerate(entries):
        entry.outcome = TideError(f"outcome {i}")
        entry.next = entries[i + 1] if i + 1 < count else None
    return entries


def _outcome(entry: _Entry) -> str:
    assert entry.done is not None and not entry.done.locked()  # woken: wait() returns
    with pytest.raises(TideError) as raised:
        entry.wait()
    return raised.value.message


def test_a_sender_interrupted_before_its_turn_passes_it_on() -> None:
    first, left, last = _chain(3)
    left.done = _InterruptedLock(left.done)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        left.wait()
    assert left.left
    assert last.done is not None and last.done.locked()  # nobody's turn has come yet
    _wake(first)  # the answer
    assert _outcome(first) == "outcome 0"  # and first wakes the next: the one that left
    assert _outcome(last) == "outcome 2"


def test_a_sender_interrupted_as_its_turn_comes_passes_it_on() -> None:
    first, left, last = _chain(3)
    _wake(first)
    assert _outcome(first) == "outcome 0"  # its turn has come: left's lock is released
    left.done = _InterruptedLock(left.done)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        left.wait()
    assert _outcome(last) == "outcome 2"


def test_a_chain_skips_every_sender_that_left() -> None:
    entries = _chain(4)
    entries[1].left = entries[2].left = True  # both interrupted before their turn
    _wake(entries[0])
    assert _outcome(entries[0]) == "outcome 0"
    assert _outcome(entries[3]) == "outcome 3"


class HeldGateway:
    """Answers each call (every message written) once the test lets it."""

    def __init__(self) -> None:
        self.requests: list[gateway_pb2.ProduceRequest] = []
        self.go = threading.Event()

    def __call__(
        self, request: gateway_pb2.ProduceRequest, what: str
    ) -> Future[gateway_pb2.ProduceResponse]:
        self.requests.append(request)
        future: Future[gateway_pb2.ProduceResponse] = Future()

        def answer() -> None:
            self.go.wait(RESULT_TIMEOUT_S)
            future.set_result(each_written(request))

        threading.Thread(target=answer).start()
        return future


def test_sends_in_unanswered_calls_and_waiting_for_room_are_counted() -> None:
    """What decides whether a batch opened by a send() needs the sender to time its
    linger: the send()s whose messages are in calls not answered yet, and those waiting
    for in-flight room, are not on their way to join it."""
    gateway = HeldGateway()
    acc, in_flight = accumulator(gateway, batch_max_messages=256)
    in_flight.max_sends = 1  # the second send waits for the first's room
    results: dict[int, SendResult] = {}

    def work(thread: int) -> None:
        results[thread] = blocking_send(acc, f"ok-{thread}")

    first = threading.Thread(target=work, args=(0,))
    first.start()
    wait_until(lambda: len(gateway.requests) == 1, "the first send's call", RESULT_TIMEOUT_S)
    assert (acc._sync_sent, acc._sync_blocked) == (1, 0)
    second = threading.Thread(target=work, args=(1,))
    second.start()
    wait_until(lambda: acc._sync_blocked == 1, "the second waiting for room", RESULT_TIMEOUT_S)
    gateway.go.set()
    for thread in (first, second):
        thread.join(RESULT_TIMEOUT_S)
    assert {t: r.unique_key for t, r in results.items()} == {0: "k-ok-0", 1: "k-ok-1"}
    assert (acc._sync_sent, acc._sync_blocked) == (0, 0)
    acc.close()
    assert in_flight.sends == 0

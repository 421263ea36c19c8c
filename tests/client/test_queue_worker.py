"""QueueWorker's delivery, send-back, local retry and commit rules, over an in-memory
queue.

The reader here stands in for the gateway (this is a unit test of the worker's logic; the
integration tests run it against real services).
"""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import grpc
import pytest

from tide.client import (
    ConsumeFrom,
    ConsumeResult,
    MessageQueue,
    QueueOffsets,
    ReceivedMessage,
    SendBackResult,
    Unavailable,
)
from tide.client._pull_consumer import GatewayReader
from tide.client._queue_worker import (
    MAX_SEND_BACK_RETRY_MS,
    QueueWorker,
    WorkerSettings,
    retry_wait_ms,
    send_back_wait_ms,
)
from tide.client._rpc import Connection
from tide.v1 import gateway_pb2, storage_pb2
from tide.waiting import wait_until

QUEUE = MessageQueue("T", "broker-a", 0)
WAIT_S = 10.0


class _Future:
    def __init__(self, response: gateway_pb2.PullResponse | None) -> None:
        self._response = response
        self._cancelled = threading.Event()

    def result(self) -> gateway_pb2.PullResponse:
        if self._response is not None:
            return self._response
        self._cancelled.wait(WAIT_S)  # a long poll with nothing new: held until cancelled
        raise grpc.FutureCancelledError()

    def cancel(self) -> bool:
        self._cancelled.set()
        return True

    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class MemoryReader(GatewayReader):
    def __init__(self, count: int, committed: int = -1) -> None:
        super().__init__(Connection("127.0.0.1:1"))
        self.count = count
        self.committed_offset = committed
        self.commits: list[int] = []
        # (queue offset, delay level) of every send-back that succeeded; the next
        # ``failing_send_backs`` fail as a gateway that is down does.
        self.sent_back: list[tuple[int, int]] = []
        self.failing_send_backs = 0
        self.send_back_calls = 0

    def committed(self, group: str, queue: MessageQueue) -> int:
        return self.committed_offset

    def offsets(self, queue: MessageQueue) -> QueueOffsets:
        return QueueOffsets(0, self.count)

    def commit(self, group: str, queue: MessageQueue, offset: int) -> None:
        self.commits.append(offset)
        self.committed_offset = offset

    def send_back(
        self,
        group: str,
        message: ReceivedMessage,
        delay_level: int = 0,
        max_reconsume_times: int = 0,
        *,
        single_attempt: bool = False,
    ) -> SendBackResult:
        self.send_back_calls += 1
        if self.failing_send_backs:
            self.failing_send_backs -= 1
            raise Unavailable("the gateway is down")
        self.sent_back.append((message.queue_offset, delay_level))
        dead = delay_level == -1
        return SendBackResult("%DLQ%g" if dead else "%RETRY%g", dead, 1, 0, "id")

    def pull_future(self, request: gateway_pb2.PullRequest) -> Any:
        end = min(self.count, request.offset + request.max_messages)
        if request.offset >= self.count:
            return _Future(None)
        response = gateway_pb2.PullResponse(
            status=gateway_pb2.PullResponse.FOUND,
            messages=[
                storage_pb2.StoredMessage(topic="T", queue_id=0, queue_offset=o, body=b"%d" % o)
                for o in range(request.offset, end)
            ],
            next_offset=end,
            min_offset=0,
            max_offset=self.count,
        )
        return _Future(response)


def settings(**overrides: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "group": "g",
        "expression": "*",
        "consume_from": ConsumeFrom("first"),
        "max_messages": 2,
        "long_poll_timeout_ms": 1_000,
        "commit_interval_ms": 60_000,
        "max_retries": 2,
        "retry_backoff_ms": 1,
        "error_backoff_ms": 1,
    }
    values.update(overrides)
    return WorkerSettings(**values)


def run_until(worker: QueueWorker, condition: Any, what: str) -> None:
    worker.start()
    try:
        wait_until(condition, what, WAIT_S)
    finally:
        worker.stop()
        assert worker.join(WAIT_S)


def test_delivers_in_order_and_commits_when_drained_and_on_stop() -> None:
    reader = MemoryReader(5)
    seen: list[int] = []
    worker = QueueWorker(QUEUE, reader, settings(), lambda m: seen.append(m.queue_offset))
    run_until(worker, lambda: reader.commits == [5], "offset 5 committed")
    assert seen == [0, 1, 2, 3, 4]
    assert reader.commits == [5]  # nothing new after the drain commit: no second commit


def test_resumes_from_the_committed_offset() -> None:
    reader = MemoryReader(5, committed=3)
    seen: list[int] = []
    worker = QueueWorker(QUEUE, reader, settings(), lambda m: seen.append(m.queue_offset))
    run_until(worker, lambda: reader.commits == [5], "offset 5 committed")
    assert seen == [3, 4]


def test_last_starts_at_the_end_and_commits_it() -> None:
    reader = MemoryReader(5)
    seen: list[int] = []
    worker = QueueWorker(
        QUEUE, reader, settings(consume_from=ConsumeFrom("last")), lambda m: seen.append(1)
    )
    run_until(worker, lambda: reader.commits == [5], "offset 5 committed")
    assert seen == []


def test_a_failing_message_is_sent_back_and_the_queue_moves_on() -> None:
    reader = MemoryReader(3)
    attempts: list[int] = []

    def callback(message: ReceivedMessage) -> None:
        attempts.append(message.queue_offset)
        if message.queue_offset == 1:
            raise RuntimeError("cannot")

    worker = QueueWorker(QUEUE, reader, settings(), callback)
    run_until(worker, lambda: reader.commits == [3], "offset 3 committed")
    assert attempts == [0, 1, 2]  # no local retry: the broker redelivers it later
    assert reader.sent_back == [(1, 0)]  # delay level 0: the group's retry policy
    assert (worker.delivered, worker.sent_back, worker.dead_lettered) == (2, 1, 0)


def test_reconsume_later_sends_back_and_none_or_success_do_not() -> None:
    reader = MemoryReader(3)
    results = {0: None, 1: ConsumeResult.RECONSUME_LATER, 2: ConsumeResult.SUCCESS}
    worker = QueueWorker(QUEUE, reader, settings(), lambda m: results[m.queue_offset])
    run_until(worker, lambda: reader.commits == [3], "offset 3 committed")
    assert reader.sent_back == [(1, 0)]


def test_a_failed_send_back_holds_the_queue_until_the_message_is_sent_back() -> None:
    reader = MemoryReader(3)
    reader.failing_send_backs = 2
    attempts: list[int] = []

    def callback(message: ReceivedMessage) -> None:
        attempts.append(message.queue_offset)
        if message.queue_offset == 1:
            # The position stays at the failing message while it is not sent back.
            assert worker.position == 1
            raise RuntimeError("cannot")

    worker = QueueWorker(QUEUE, reader, settings(), callback)
    run_until(worker, lambda: reader.commits == [3], "offset 3 committed")
    # Consumed again after each failed send-back, then sent back; never dropped.
    assert attempts == [0, 1, 1, 1, 2]
    assert reader.send_back_calls == 3
    assert reader.sent_back == [(1, 0)]


def test_a_message_consumed_after_a_failed_send_back_is_not_sent_back() -> None:
    reader = MemoryReader(2)
    reader.failing_send_backs = 1
    attempts: list[int] = []

    def callback(message: ReceivedMessage) -> None:
        attempts.append(message.queue_offset)
        if attempts.count(1) == 1 and message.queue_offset == 1:
            raise RuntimeError("not yet")

    worker = QueueWorker(QUEUE, reader, settings(), callback)
    run_until(worker, lambda: reader.commits == [2], "offset 2 committed")
    assert attempts == [0, 1, 1]
    assert reader.sent_back == []
    assert worker.delivered == 2


def test_orderly_a_failing_callback_is_retried_then_succeeds() -> None:
    reader = MemoryReader(4)
    attempts: list[int] = []

    def callback(message: ReceivedMessage) -> None:
        attempts.append(message.queue_offset)
        if message.queue_offset == 2 and attempts.count(2) < 3:
            raise RuntimeError("not yet")

    worker = QueueWorker(QUEUE, reader, settings(max_retries=2, orderly=True), callback)
    run_until(worker, lambda: reader.commits == [4], "offset 4 committed")
    assert attempts == [0, 1, 2, 2, 2, 3]
    assert reader.sent_back == []
    assert worker.delivered == 4


def test_orderly_a_message_failing_every_retry_is_dead_lettered() -> None:
    reader = MemoryReader(3)
    attempts: list[int] = []

    def callback(message: ReceivedMessage) -> None:
        attempts.append(message.queue_offset)
        if message.queue_offset == 1:
            raise RuntimeError("always")

    reader.failing_send_backs = 1  # the dead-lettering too is tried until it is done
    worker = QueueWorker(QUEUE, reader, settings(max_retries=2, orderly=True), callback)
    run_until(worker, lambda: reader.commits == [3], "offset 3 committed")
    assert attempts == [0, 1, 1, 1, 2]
    assert reader.sent_back == [(1, -1)]  # delay level -1: the dead-letter queue
    assert worker.dead_lettered == 1


def test_stop_during_retries_commits_the_failing_message_for_the_next_owner() -> None:
    reader = MemoryReader(3)
    failing = threading.Event()

    def callback(message: ReceivedMessage) -> None:
        if message.queue_offset == 1:
            failing.set()
            raise RuntimeError("down")

    worker = QueueWorker(
        QUEUE, reader, settings(max_retries=5, retry_backoff_ms=60_000, orderly=True), callback
    )
    run_until(worker, failing.is_set, "the handler to fail")
    assert reader.commits == [1]
    assert worker.position == 1


def test_stop_cancels_a_long_poll_at_once() -> None:
    reader = MemoryReader(0)
    worker = QueueWorker(QUEUE, reader, settings(long_poll_timeout_ms=30_000), lambda m: None)
    worker.start()
    # The start position is committed before the long poll.
    wait_until(lambda: reader.commits == [0], "offset 0 committed", WAIT_S)
    started = time.monotonic()
    worker.stop()
    assert worker.join(WAIT_S)
    assert time.monotonic() - started < WAIT_S


@pytest.mark.parametrize(("failures", "expected"), [(1, 100), (2, 200), (3, 400), (30, 60_000)])
def test_retry_wait_doubles_and_is_capped(failures: int, expected: int) -> None:
    assert retry_wait_ms(settings(retry_backoff_ms=100), failures) == expected


@pytest.mark.parametrize(("failures", "expected"), [(1, 50), (2, 100), (7, 3_200), (8, 5_000)])
def test_a_failed_send_back_is_tried_again_within_seconds_however_long_the_outage(
    failures: int, expected: int
) -> None:
    """The queue stands still until the send-back goes through: its retries stay a few
    seconds apart (not the local retries' 60 s), so the end of an outage is seen soon."""
    assert send_back_wait_ms(settings(retry_backoff_ms=50), failures) == expected
    assert send_back_wait_ms(settings(retry_backoff_ms=50), 30) == MAX_SEND_BACK_RETRY_MS
    # A retry_backoff_ms above the ceiling is the user's wait: kept, not doubled.
    assert send_back_wait_ms(settings(retry_backoff_ms=8_000), 3) == 8_000


def test_reader_type() -> None:
    # the fake stays a GatewayReader, so the worker's typing holds
    assert isinstance(cast(GatewayReader, MemoryReader(0)), GatewayReader)


def test_pulls_carry_the_fuller_pull_settings() -> None:
    class Recording(MemoryReader):
        def __init__(self) -> None:
            super().__init__(3)
            self.asked: list[tuple[int, int]] = []

        def pull_future(self, request: gateway_pb2.PullRequest) -> Any:
            self.asked.append((request.min_messages, request.min_messages_wait_ms))
            return super().pull_future(request)

    reader = Recording()
    fuller = settings(min_messages=2, min_messages_wait_ms=40)
    worker = QueueWorker(QUEUE, reader, fuller, lambda m: None)
    run_until(worker, lambda: reader.commits == [3], "offset 3 committed")
    assert reader.asked and set(reader.asked) == {(2, 40)}

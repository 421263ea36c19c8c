"""QueueWorker's delivery, retry, skip and commit rules, over an in-memory queue.

The reader here stands in for the gateway (this is a unit test of the worker's logic; the
integration tests run it against real services).
"""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import grpc
import pytest

from tide.client import ConsumeFrom, MessageQueue, QueueOffsets, ReceivedMessage
from tide.client._pull_consumer import GatewayReader
from tide.client._queue_worker import QueueWorker, WorkerSettings, retry_wait_ms
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

    def committed(self, group: str, queue: MessageQueue) -> int:
        return self.committed_offset

    def offsets(self, queue: MessageQueue) -> QueueOffsets:
        return QueueOffsets(0, self.count)

    def commit(self, group: str, queue: MessageQueue, offset: int) -> None:
        self.commits.append(offset)
        self.committed_offset = offset

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


def test_a_failing_callback_is_retried_then_succeeds() -> None:
    reader = MemoryReader(4)
    attempts: list[int] = []

    def callback(message: ReceivedMessage) -> None:
        attempts.append(message.queue_offset)
        if message.queue_offset == 2 and attempts.count(2) < 3:
            raise RuntimeError("not yet")

    worker = QueueWorker(QUEUE, reader, settings(max_retries=2), callback)
    run_until(worker, lambda: reader.commits == [4], "offset 4 committed")
    assert attempts == [0, 1, 2, 2, 2, 3]
    assert worker.skipped == 0
    assert worker.delivered == 4


def test_a_message_failing_every_retry_is_skipped() -> None:
    reader = MemoryReader(3)
    attempts: list[int] = []

    def callback(message: ReceivedMessage) -> None:
        attempts.append(message.queue_offset)
        if message.queue_offset == 1:
            raise RuntimeError("always")

    worker = QueueWorker(QUEUE, reader, settings(max_retries=2), callback)
    run_until(worker, lambda: reader.commits == [3], "offset 3 committed")
    assert attempts == [0, 1, 1, 1, 2]
    assert worker.skipped == 1


def test_stop_during_retries_commits_the_failing_message_for_the_next_owner() -> None:
    reader = MemoryReader(3)
    failing = threading.Event()

    def callback(message: ReceivedMessage) -> None:
        if message.queue_offset == 1:
            failing.set()
            raise RuntimeError("down")

    worker = QueueWorker(QUEUE, reader, settings(max_retries=5, retry_backoff_ms=60_000), callback)
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


def test_reader_type() -> None:
    # the fake stays a GatewayReader, so the worker's typing holds
    assert isinstance(cast(GatewayReader, MemoryReader(0)), GatewayReader)

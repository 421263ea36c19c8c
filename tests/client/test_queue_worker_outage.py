"""QueueWorker during a master outage: commits fail UNAVAILABLE (consumer offsets live on
the master) while pulls go on (from the slave). The worker keeps consuming, keeps its
position in memory, logs once, retries once per commit interval, and commits once the
master is back.

The reader stands in for the gateway (a unit test of the worker's logic; the cluster test
tests/test_ha_cluster.py runs it against real services).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc
import pytest

from tests.client.test_queue_worker import (
    QUEUE,
    WAIT_S,
    MemoryReader,
    _Future,
    run_until,
    settings,
)
from tide.client import MessageQueue, Unavailable
from tide.client._queue_worker import MIN_COMMIT_RETRY_MS, QueueWorker
from tide.client._rpc import Connection
from tide.v1 import gateway_pb2
from tide.waiting import wait_until

# How long an empty pull "long-polls" here before answering NO_NEW_MESSAGE.
EMPTY_PULL_S = 0.01


class FlakyCommits(MemoryReader):
    """Commits fail with UNAVAILABLE while ``down`` is set; every attempt is recorded."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.down = threading.Event()
        self.attempts: list[int] = []
        self.single: list[bool] = []
        self.empty_pulls = 0

    def commit(self, group: str, queue: MessageQueue, offset: int) -> None:
        self.attempts.append(offset)
        if self.down.is_set():
            raise Unavailable(
                "consumer offsets live on the master of broker-a; retry when it is back"
            )
        super().commit(group, queue, offset)

    def try_commit(self, group: str, queue: MessageQueue, offset: int) -> None:
        self.single.append(True)
        super().try_commit(group, queue, offset)

    def pull_future(self, request: gateway_pb2.PullRequest) -> Any:
        if request.offset < self.count:
            return super().pull_future(request)
        self.empty_pulls += 1
        # Deliberately lets time pass: a short long poll that finds nothing new.
        time.sleep(EMPTY_PULL_S)
        return _Future(
            gateway_pb2.PullResponse(
                status=gateway_pb2.PullResponse.NO_NEW_MESSAGE,
                next_offset=request.offset,
                min_offset=0,
                max_offset=self.count,
            )
        )


def test_consuming_goes_on_while_commits_fail_and_the_position_is_committed_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = FlakyCommits(6)
    reader.down.set()
    seen: list[int] = []
    worker = QueueWorker(
        QUEUE,
        reader,
        settings(commit_interval_ms=MIN_COMMIT_RETRY_MS, long_poll_timeout_ms=50),
        lambda m: seen.append(m.queue_offset),
    )
    caplog.set_level(logging.DEBUG, logger="tide.client.consumer")
    worker.start()
    try:
        wait_until(
            lambda: seen == [0, 1, 2, 3, 4, 5] and len(reader.attempts) >= 3,
            "all six consumed and three commit attempts",
            WAIT_S,
        )
        assert reader.commits == []  # nothing stored while down
        assert worker.commit_failures >= 3
        assert worker.position == 6
        warnings = [
            r for r in caplog.records if r.levelno == logging.WARNING and "commit of" in r.message
        ]
        assert len(warnings) == 1, [r.message for r in warnings]
        assert "consumer offsets live on the master of broker-a" in warnings[0].message
        reader.down.clear()
        wait_until(lambda: reader.commits == [6], "offset 6 committed", WAIT_S)
        assert worker.commit_failures == 0
        assert any("succeeded after" in r.message for r in caplog.records)
    finally:
        worker.stop()
        assert worker.join(10)
    assert seen == [0, 1, 2, 3, 4, 5]  # no redelivery
    assert reader.commits == [6]  # nothing new after the commit
    assert all(reader.single)


def test_failed_commits_are_retried_once_per_interval_not_before_every_pull() -> None:
    reader = FlakyCommits(3)
    reader.down.set()
    worker = QueueWorker(QUEUE, reader, settings(commit_interval_ms=60_000), lambda m: None)
    worker.start()
    try:
        wait_until(lambda: len(reader.attempts) >= 1, "a commit attempt", WAIT_S)
        pulls = reader.empty_pulls
        wait_until(lambda: reader.empty_pulls >= pulls + 50, "50 more empty pulls", WAIT_S)
        assert reader.attempts == [3]  # none of them tried the commit again
    finally:
        worker.stop()
        assert worker.join(10)
    assert reader.attempts == [3, 3]  # and the final attempt on release


def test_the_final_commit_on_release_is_retried_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = FlakyCommits(2)
    reader.down.set()
    caplog.set_level(logging.INFO, logger="tide.client.consumer")
    worker = QueueWorker(QUEUE, reader, settings(), lambda m: None)
    run_until(worker, lambda: worker.position == 2, "position 2")
    assert reader.attempts[-1] == 2
    assert any(r.levelno == logging.ERROR and "final commit" in r.message for r in caplog.records)


def test_single_attempt_applies_to_the_calling_thread_only() -> None:
    connection = Connection("127.0.0.1:1")
    calls: list[int] = []

    def failing(request: object, timeout: float) -> object:
        calls.append(1)
        raise _unavailable()

    try:
        with connection.single_attempt(), pytest.raises(Unavailable):
            connection.call(failing, object(), "probe")  # type: ignore[arg-type]
        assert len(calls) == 1
        with pytest.raises(Unavailable):
            connection.call(failing, object(), "probe")  # type: ignore[arg-type]
        assert len(calls) == 1 + connection.retry.max_attempts
    finally:
        connection.close()


def _unavailable() -> Exception:
    class _Error(grpc.RpcError, grpc.Call):  # type: ignore[misc]
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return "down"

    return _Error()

"""SYNC_MASTER's ack waiter: completion order, gaps, timeouts (cancelled waiters), limits."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from services.storage.engine.ha_ack_waiter import ReplicaOutcome, SlaveAckWaiter

GAP = 1000


def waiter(max_waiting: int = 100) -> SlaveAckWaiter:
    w = SlaveAckWaiter(max_gap_bytes=GAP, timeout_ms=1000, max_waiting=max_waiting)
    w.slave_connected()
    return w


def outcome(future: Future[ReplicaOutcome]) -> ReplicaOutcome:
    assert future.done()
    return future.result()


def test_no_slave_is_not_available_at_once() -> None:
    w = SlaveAckWaiter(max_gap_bytes=GAP, timeout_ms=1000)
    assert outcome(w.request(10)) is ReplicaOutcome.NOT_AVAILABLE
    w.slave_connected()
    w.slave_disconnected()
    assert outcome(w.request(10)) is ReplicaOutcome.NOT_AVAILABLE
    assert w.waiting == 0


def test_waiters_complete_in_offset_order_when_the_ack_passes_them() -> None:
    w = waiter()
    futures = {end: w.request(end) for end in (300, 100, 200, 400)}
    assert not any(f.done() for f in futures.values())
    assert w.ack(99) == 0
    assert w.ack(200) == 2  # 100 and 200: an ack at exactly the end offset covers it
    assert outcome(futures[100]) is ReplicaOutcome.ACKED
    assert outcome(futures[200]) is ReplicaOutcome.ACKED
    assert not futures[300].done() and not futures[400].done()
    assert w.ack(150) == 0  # an older ack (another slave) does not move the offset back
    assert w.ack_offset == 200
    assert w.ack(1000) == 2
    assert outcome(futures[400]) is ReplicaOutcome.ACKED
    assert w.waiting == 0


def test_already_acked_offset_completes_at_once() -> None:
    w = waiter()
    w.ack(500)
    assert outcome(w.request(500)) is ReplicaOutcome.ACKED
    assert w.waiting == 0


def test_slave_too_far_behind_is_not_available() -> None:
    w = waiter()
    w.ack(100)
    assert outcome(w.request(100 + GAP + 1)) is ReplicaOutcome.NOT_AVAILABLE
    assert not w.request(100 + GAP).done()


def test_cancelled_waiter_is_skipped_and_others_complete() -> None:
    w = waiter()
    first, second = w.request(100), w.request(200)
    assert first.cancel()  # the caller timed out (FLUSH_SLAVE_TIMEOUT)
    assert w.ack(300) == 1
    assert first.cancelled()
    assert outcome(second) is ReplicaOutcome.ACKED


def test_limit_drops_cancelled_waiters_then_refuses() -> None:
    w = waiter(max_waiting=3)
    futures = [w.request(100 + i) for i in range(3)]
    futures[0].cancel()
    assert not w.request(200).done()  # room made by dropping the cancelled one
    assert w.waiting == 3
    assert outcome(w.request(300)) is ReplicaOutcome.NOT_AVAILABLE  # still full
    assert w.ack(1000) == 3


def test_close_completes_waiters_as_not_available() -> None:
    w = waiter()
    future = w.request(100)
    w.close()
    assert outcome(future) is ReplicaOutcome.NOT_AVAILABLE
    assert outcome(w.request(50)) is ReplicaOutcome.NOT_AVAILABLE


def test_disconnect_without_connect_is_an_error() -> None:
    w = SlaveAckWaiter(max_gap_bytes=GAP, timeout_ms=1000)
    with pytest.raises(RuntimeError):
        w.slave_disconnected()


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        SlaveAckWaiter(max_gap_bytes=0, timeout_ms=1000)

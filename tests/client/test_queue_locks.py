"""tide/client/_queue_locks.py without a cluster: the member's lease and the batching of
lock calls per broker (test_orderly_consumer.py covers the wiring)."""

from __future__ import annotations

import threading
import time

from tide.client._queue_locks import Locker, QueueLease, by_broker
from tide.client._types import MessageQueue
from tide.limits import LOCK_QUEUES_MAX_COUNT


def test_a_lease_is_valid_until_its_end_and_only_extended() -> None:
    lease = QueueLease()
    assert not lease.valid()
    assert not lease.wait_valid(0.0)
    lease.extend(time.monotonic() + 60)
    assert lease.valid()
    lease.extend(time.monotonic() - 1)  # an older renewal's answer does not shorten it
    assert lease.valid()


def test_a_waiter_wakes_when_the_lease_is_renewed() -> None:
    lease = QueueLease()
    renewed = threading.Timer(0.05, lambda: lease.extend(time.monotonic() + 60))
    renewed.start()
    try:
        assert lease.wait_valid(30.0)  # returns on the renewal, not after 30 s
    finally:
        renewed.cancel()


def test_lock_calls_are_per_broker_and_bounded() -> None:
    queues = [MessageQueue("T", "b", i) for i in range(LOCK_QUEUES_MAX_COUNT + 1)]
    queues.append(MessageQueue("T", "a", 0))
    batches = by_broker(queues)
    assert [(broker, len(batch)) for broker, batch in batches] == [
        ("a", 1),
        ("b", LOCK_QUEUES_MAX_COUNT),
        ("b", 1),
    ]


def test_renewals_fit_a_short_broker_lease() -> None:
    locker = Locker(None, "g", "c")  # type: ignore[arg-type]  # no call is made
    assert locker.renew_interval_ms(20_000) == 20_000  # lease not known yet
    locker.max_live_ms = 60_000  # the default: RocketMQ's 20 s interval fits
    assert locker.renew_interval_ms(20_000) == 20_000
    locker.max_live_ms = 3_000  # a member's lease of 1.5 s: renewed every second
    assert locker.renew_interval_ms(20_000) == 1_000

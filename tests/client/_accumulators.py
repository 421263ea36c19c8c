"""An Accumulator against a stand-in carrier, for the accumulator's tests: a 60 s linger
(batches go when full, when every blocking send waits in them, or at close), room for
256 sends of 1 MiB, 4 calls at once."""

from __future__ import annotations

from tide.client._accumulator import Accumulator, Carrier, Limits
from tide.client._in_flight import InFlight
from tide.client._producer import topic_results

LONG_LINGER_MS = 60_000


def accumulator(carrier: Carrier, batch_max_messages: int) -> tuple[Accumulator, InFlight]:
    in_flight = InFlight(256, 1 << 20)
    limits = Limits(LONG_LINGER_MS, batch_max_messages, 1 << 20, 4)
    acc = Accumulator(
        limits, in_flight, carrier, topic_results, timeout_s=1.0, close_timeout_s=10.0
    )
    return acc, in_flight

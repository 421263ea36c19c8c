"""The bound on a producer's unfinished async sends: a count and a number of bytes.

A count alone lets a few large batches hold all the memory (256 sends of 1,024 messages
of 4 MiB), so the bytes of the messages held for unfinished sends are bounded too. The
caller of an async send waits (backpressure) while either bound is reached, for up to the
RPC timeout, then gets ResourceExhausted naming the bound. A send larger than the byte
bound alone is let through when nothing else is in flight (it would never fit otherwise).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from tide.client._errors import ResourceExhausted
from tide.client._types import Message


class InFlight:
    def __init__(self, max_sends: int, max_bytes: int) -> None:
        self.max_sends = max_sends
        self.max_bytes = max_bytes
        self.sends = 0
        self.bytes = 0
        self.peak_bytes = 0  # the most held at once (tests, diagnostics)
        # the condition's lock, taken directly (Condition's own __enter__ and __exit__
        # are two more Python calls on every send)
        self._mutex = threading.RLock()
        self._changed = threading.Condition(self._mutex)

    def acquire(
        self,
        size_bytes: int,
        timeout_s: float,
        what: str,
        *,
        on_wait: Callable[[int], None] | None = None,
    ) -> None:
        """Wait for room for one send of ``size_bytes``; ResourceExhausted after
        ``timeout_s``. ``on_wait(1)`` when it has to wait, ``on_wait(-1)`` when that ends
        (called under this bound's lock)."""
        with self._mutex:
            if not self.fits(size_bytes):  # the room is there, the common case: no wait
                if on_wait is not None:
                    on_wait(1)
                try:
                    room = self._changed.wait_for(lambda: self.fits(size_bytes), timeout_s)
                finally:
                    if on_wait is not None:
                        on_wait(-1)
                if not room:
                    raise self.exhausted(what, timeout_s)
            self.take(size_bytes)

    def release(self, size_bytes: int, sends: int = 1) -> None:
        """Give back ``sends`` sends holding ``size_bytes`` in all."""
        with self._mutex:
            self.give_back(size_bytes, sends)
            self._changed.notify_all()

    # The bookkeeping (the asyncio producer's bound, aio/_in_flight.py, shares it).

    def fits(self, size_bytes: int) -> bool:
        if self.sends >= self.max_sends:
            return False
        return self.sends == 0 or self.bytes + size_bytes <= self.max_bytes

    def take(self, size_bytes: int) -> None:
        self.sends += 1
        self.bytes += size_bytes
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def give_back(self, size_bytes: int, sends: int = 1) -> None:
        self.sends -= sends
        self.bytes -= size_bytes

    def exhausted(self, what: str, timeout_s: float) -> ResourceExhausted:
        return ResourceExhausted(
            f"{what}: {self.sends} async sends ({self.bytes} bytes) are unfinished "
            f"(max_in_flight {self.max_sends}, max_in_flight_bytes {self.max_bytes}) "
            f"and not enough finished within {int(timeout_s * 1000)} ms"
        )


def message_bytes(messages: Sequence[Message]) -> int:
    """What a batch holds in memory, about: its bodies, tags, keys and properties."""
    total = 0
    for m in messages:
        body = m.body if isinstance(m.body, bytes) else m.body.encode("utf-8", "surrogatepass")
        total += len(body) + len(m.topic) + len(m.tags) + sum(len(k) + 1 for k in m.keys)
        total += sum(len(k) + len(v) + 2 for k, v in m.properties.items())
    return total

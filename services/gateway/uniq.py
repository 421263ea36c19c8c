"""Unique keys (the UNIQ_KEY property) as RocketMQ's MessageClientIDSetter makes them.

32 upper-case hex characters, 16 bytes big-endian:

    ip (4)  pid (2)  per-process value (4)  ms since the month began (4)  counter (2)

The first 10 bytes are fixed for the process (RocketMQ uses its class loader's hash where
we use a random value); the time is counted from the start of the current month in local
time, and the base moves when a month ends. The counter wraps at 65536.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time
from collections.abc import Callable
from datetime import datetime

from tide.format import numbered_keys

UNIQUE_KEY_CHARS = 32
_FIXED = struct.Struct(">4sHI")


def local_ipv4() -> bytes:
    """This host's outward IPv4 address (no packet is sent), else 127.0.0.1."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            return socket.inet_aton(probe.getsockname()[0])
    except OSError:
        return socket.inet_aton("127.0.0.1")


def month_bounds_ms(now_ms: int) -> tuple[int, int]:
    """(start of the month holding ``now_ms``, start of the next one), local time, ms."""
    now = datetime.fromtimestamp(now_ms / 1000)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if start.month == 12:
        following = start.replace(year=start.year + 1, month=1)
    else:
        following = start.replace(month=start.month + 1)
    return int(start.timestamp() * 1000), int(following.timestamp() * 1000)


class UniqueKeyGenerator:
    def __init__(
        self,
        *,
        ip: bytes | None = None,
        pid: int | None = None,
        process_value: int | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        ip = local_ipv4() if ip is None else ip
        if len(ip) != 4:
            raise ValueError(f"ip must be 4 bytes (IPv4), got {len(ip)}")
        pid = os.getpid() if pid is None else pid
        value = random.getrandbits(32) if process_value is None else process_value
        self._prefix = _FIXED.pack(ip, pid & 0xFFFF, value & 0xFFFFFFFF).hex().upper()
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._start_ms, self._next_start_ms = month_bounds_ms(self._clock_ms())
        self._counter = 0

    @property
    def prefix(self) -> str:
        """The fixed first 20 hex characters (ip, pid, per-process value)."""
        return self._prefix

    def _time_part(self) -> str:
        """The prefix and the 8 hex characters of the ms since the month began."""
        now_ms = self._clock_ms()
        if now_ms >= self._next_start_ms:
            self._start_ms, self._next_start_ms = month_bounds_ms(now_ms)
        diff = now_ms - self._start_ms
        if -1_000_000 < diff < 0:  # the clock went back a little
            diff = 0
        # Java's (int) cast, written as its two's complement bits (what ">i" packs).
        return f"{self._prefix}{diff & 0xFFFFFFFF:08X}"

    def next(self) -> str:
        counter = self._counter
        self._counter = (counter + 1) & 0xFFFF
        return f"{self._time_part()}{counter:04X}"

    def next_many(self, count: int) -> list[str]:
        """``count`` keys at once (one clock reading; consecutive counters), as ``count``
        calls of :meth:`next` within the same millisecond give."""
        head = self._time_part()
        first = self._counter
        self._counter = (first + count) & 0xFFFF
        return numbered_keys(head, first, count)  # one compiled loop when it runs

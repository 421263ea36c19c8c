"""How late this box lets a process wake: a control measured in the same run, for the few
tests whose claim is a lateness bound (a timer "on time"). A loaded box (five engineers'
runs on 2 cores, load average 40-55) delays every process's wake-ups by seconds; a bound
against the wall clock alone then fails though nothing is wrong. The probe's worst wake-up
delay while the test waited scales such a bound, so it stays tight on a quiet box."""

from __future__ import annotations

import threading
import time
from types import TracebackType

TICK_S = 0.01  # the probe's sleep: short enough to see stalls of tens of ms


class StallProbe:
    """``with StallProbe() as probe: ...``; then ``probe.worst_ms``: the longest a 10 ms
    sleep overslept in between (0 when quiet, seconds under heavy load), and
    ``probe.total_late_ms``: all its oversleeping added up (how much of the time a
    process on this box waited for a core instead of running)."""

    def __init__(self) -> None:
        self.worst_ms = 0.0
        self.total_late_ms = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-probe", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            time.sleep(TICK_S)  # the measurement itself: how late does it wake
            late_ms = (time.monotonic() - started - TICK_S) * 1000
            self.worst_ms = max(self.worst_ms, late_ms)
            self.total_late_ms += max(0.0, late_ms)

    def __enter__(self) -> StallProbe:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

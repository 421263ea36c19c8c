"""A small base for the services' background threads: named, stoppable, never silent.

Used by the storage (flush, group commit, commit, checkpoint, retention) and the
dispatch (flush of consume queues and index).
"""

from __future__ import annotations

import logging
import threading
import time


class ServiceThread:
    """Runs ``run_once`` every ``interval_s`` (or sooner when woken) until stopped.

    An exception in ``run_once`` is logged with its traceback and counted; the thread
    keeps going (a transient EIO must not silently end flushing), backing off to the
    interval between attempts.
    """

    # "<service>.<role>", e.g. "storage.flush": the logger is tide.<name>.
    name = "service"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"tide-{self.name}", daemon=True)
        self.failures = 0
        self.log = logging.getLogger(f"tide.{self.name}")

    def start(self) -> None:
        self._thread.start()

    def wakeup(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.run_once()
            except Exception:
                self.failures += 1
                self.log.exception("%s failed (%d failures so far)", self.name, self.failures)
        self.on_stop()

    def run_once(self) -> None:
        raise NotImplementedError

    def on_stop(self) -> None:
        """Last work after the loop ended (final flush); runs on the thread."""

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self.log.error("%s did not stop within %.0f s", self.name, timeout_s)


class PagePolicy:
    """RocketMQ's "at least N pages, everything every T ms" rule for flush and commit."""

    def __init__(self, least_pages: int, thorough_interval_ms: int) -> None:
        self._least_pages = least_pages
        self._thorough_interval_s = thorough_interval_ms / 1000
        self._last_thorough = time.monotonic()

    def least_pages_now(self) -> int:
        """``least_pages``, or 0 (any dirty byte) when a thorough round is due."""
        return 0 if self.thorough_due() else self._least_pages

    def thorough_due(self) -> bool:
        """True (once per interval) when everything must be flushed this round."""
        now = time.monotonic()
        if now - self._last_thorough >= self._thorough_interval_s:
            self._last_thorough = now
            return True
        return False

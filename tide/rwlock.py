"""A small readers-writer lock for tables read far more often than written.

Many readers may hold it together; a writer holds it alone. Writers are preferred: once
a writer waits, new readers wait behind it, so a steady stream of reads cannot starve
a registration or an expiry scan. Not reentrant (a thread holding it must not take it
again, in either mode).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RWLock:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @property
    def writers_waiting(self) -> int:
        """Writers blocked waiting for the lock now (a snapshot: for tests and gauges)."""
        return self._writers_waiting

    @contextmanager
    def read(self) -> Iterator[None]:
        """Hold the lock shared for the ``with`` block."""
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        """Hold the lock exclusively for the ``with`` block."""
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            except BaseException:
                self._writers_waiting -= 1
                self._cond.notify_all()  # readers held back by this writer may go on
                raise
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()

"""DiskGuard: whether the commitlog's disk has room for appends.

Appends are refused with DiskFullError (RESOURCE_EXHAUSTED) for either of two reasons:

* the **projected** disk usage is above ``disk_refuse_writes_ratio``: what is used now
  plus what the next segment still needs (``next_segment_bytes``: a whole segment while
  the segment after the one being written does not exist yet, else nothing). Counting
  the next segment is what lets retention free room before a roll needs it: a 128 MiB
  segment cannot be preallocated on a disk 67 % full of 256 MiB, though 67 % is below
  every threshold;
* ENOSPC (or EDQUOT) met anywhere on the write path: creating a segment, the checkpoint,
  a config file (:meth:`out_of_space`).

Retention measures every pass (:meth:`update`). While the store is full an append
re-measures, at most every ``RECHECK_MS`` (a ``statvfs``: microseconds), so writes
resume by themselves once space exists again, within that delay rather than at the next
retention pass, and a refused append costs no allocation attempt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from services.storage.engine.errors import DiskFullError
from tide.files import DiskSpace, describe_space, disk_space

log = logging.getLogger("tide.storage.disk")
RECHECK_MS = 100
# Each kind of line (refusing, accepting) is logged at most this often: on a disk that
# fills and frees in turn (a file write failing each checkpoint round) it would repeat.
LOG_INTERVAL_S = 60.0


class DiskGuard:
    def __init__(
        self,
        store_dir: Path,
        disk_dir: Path,
        refuse_ratio: float,
        next_segment_bytes: Callable[[], int],
        *,
        usage_ratio: Callable[[], float] | None = None,
        space: Callable[[], DiskSpace] | None = None,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        """``disk_dir``: where the segments are (the disk measured); ``store_dir``
        names the store in messages. ``usage_ratio`` (tests) stands in for the whole
        measurement: it returns the projected ratio; ``space`` (tests) for the
        filesystem's numbers."""
        self.store_dir = store_dir
        self.disk_dir = disk_dir
        self._refuse_ratio = refuse_ratio
        self._next_segment_bytes = next_segment_bytes
        self._usage_ratio = usage_ratio
        self._space = space or (lambda: disk_space(disk_dir))
        self._clock_s = clock_s
        self._checked_at = 0.0
        self._logged_at: dict[int, float] = {}  # log level -> when last logged
        # Why appends are refused (None: they are not).
        self.full_reason: str | None = None
        self.used_ratio = 0.0  # as df counts it, at the last measurement
        self.projected_ratio = 0.0  # plus the next segment

    @property
    def full(self) -> bool:
        return self.full_reason is not None

    def measure(self) -> float:
        """Measure the disk; returns the projected usage ratio."""
        self._checked_at = self._clock_s()
        if self._usage_ratio is not None:
            self.used_ratio = self.projected_ratio = self._usage_ratio()
            return self.projected_ratio
        space = self._space()
        self.used_ratio = space.used_ratio
        self.projected_ratio = space.projected_ratio(self._next_segment_bytes())
        return self.projected_ratio

    def update(self) -> float:
        """Measure, then refuse or accept appends by the refuse-writes threshold (an
        ENOSPC seen since is forgotten once the projection says there is room)."""
        ratio = self.measure()
        above = ratio > self._refuse_ratio
        if above:
            reason = (
                f"disk usage of store {self.store_dir} is {self.used_ratio:.1%}, "
                f"{ratio:.1%} with the next segment, above the refuse-writes threshold "
                f"{self._refuse_ratio:.0%} ({describe_space(self.disk_dir)})"
            )
            if not self.full:
                self._log(
                    logging.ERROR,
                    "%s: refusing appends until retention or an operator frees space",
                    reason,
                )
            self.full_reason = f"{reason}; writes resume once retention or an operator frees space"
        elif self.full:
            self._log(
                logging.WARNING,
                "disk usage of store %s is %.1f%% (%.1f%% with the next segment): accepting "
                "appends again",
                self.store_dir,
                self.used_ratio * 100,
                ratio * 100,
            )
            self.full_reason = None
        return ratio

    def check(self) -> None:
        """Raise DiskFullError while the disk is full (re-measured at most every
        RECHECK_MS). Called on the append path: one attribute test when not full."""
        if self.full_reason is None:
            return
        self.refresh()
        if self.full_reason is not None:
            raise DiskFullError(self.full_reason)

    def refresh(self) -> None:
        """While full, re-measure if the last measurement is RECHECK_MS old (status
        calls this too, so ``writable`` turns true without waiting for an append)."""
        if self.full_reason is not None and (
            (self._clock_s() - self._checked_at) * 1000 >= RECHECK_MS
        ):
            self.update()

    def out_of_space(self, exc: OSError, what: str) -> DiskFullError:
        """ENOSPC while ``what`` (e.g. "creating segment X"): refuse appends until the
        projection says there is room again; the error to raise instead of ``exc``."""
        reason = (
            f"no space left on the disk of store {self.store_dir} while {what} "
            f"({describe_space(self.disk_dir)}): {exc.strerror or exc}"
        )
        if not self.full:
            self._log(logging.ERROR, "%s; refusing appends until space is freed", reason)
        self.full_reason = f"{reason}; writes resume once retention or an operator frees space"
        self._checked_at = self._clock_s()
        return DiskFullError(self.full_reason)

    def _log(self, level: int, message: str, *args: object) -> None:
        now = self._clock_s()
        last = self._logged_at.get(level)
        if last is None or now - last >= LOG_INTERVAL_S:
            self._logged_at[level] = now
            log.log(level, message, *args)

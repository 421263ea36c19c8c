"""Retention: RocketMQ's CleanCommitLogService, and the disk-full guard.

Every ``cleanup_interval_ms`` it measures the disk holding the commitlog:

* above ``disk_refuse_writes_ratio`` (90 %) appends are refused with DiskFullError until
  usage drops below it again;
* at the cleanup hour, or above ``disk_clean_ratio`` (75 %), segments older than
  ``retention_hours`` are deleted, oldest first;
* above ``disk_clean_force_ratio`` (85 %) the oldest segments go regardless of age.

The segment being written is never deleted. A segment a reader still holds is deleted
when released, or forcibly after ``held_segment_force_delete_ms``. At most
``delete_segments_per_pass`` segments are deleted per pass.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from services.storage.engine.commitlog import CommitLog
from services.storage.engine.config import StoreConfig
from tide.mapped import MappedFile
from tide.service_thread import ServiceThread


def disk_usage_ratio(path: Path) -> float:
    """Used fraction of the filesystem holding ``path`` (as ``df`` counts it)."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    free_for_users = st.f_bavail * st.f_frsize
    used = total - st.f_bfree * st.f_frsize
    return used / (used + free_for_users) if used + free_for_users else 0.0


class RetentionService(ServiceThread):
    name = "storage.retention"

    def __init__(
        self,
        commitlog: CommitLog,
        config: StoreConfig,
        *,
        usage_ratio: Callable[[], float] | None = None,
        clock_s: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(config.cleanup_interval_ms / 1000)
        self._commitlog = commitlog
        self._config = config
        self._usage_ratio = usage_ratio or (lambda: disk_usage_ratio(config.commitlog_dir))
        self._clock_s = clock_s or time.time
        self._doomed: list[MappedFile] = []
        self.last_ratio = 0.0
        self.deleted_segments = 0
        self.manual_requests = 0

    def request_delete(self) -> None:
        """Run a deletion pass now, as if it were the cleanup hour (admin command)."""
        self.manual_requests += 1
        self.wakeup()

    def run_once(self) -> None:
        ratio = self._usage_ratio()
        self.last_ratio = ratio
        self._guard_writes(ratio)
        self._finish_doomed()
        force = ratio > self._config.disk_clean_force_ratio
        due = (
            force
            or ratio > self._config.disk_clean_ratio
            or self._is_cleanup_hour()
            or self.manual_requests > 0
        )
        self.manual_requests = 0
        if due:
            self._delete_expired(force)

    def _guard_writes(self, ratio: float) -> None:
        full = ratio > self._config.disk_refuse_writes_ratio
        if full != self._commitlog.disk_full:
            self._commitlog.disk_full = full
            if full:
                self.log.error(
                    "disk usage %.1f%% is above %.0f%%: refusing appends",
                    ratio * 100,
                    self._config.disk_refuse_writes_ratio * 100,
                )
            else:
                self.log.warning("disk usage %.1f%%: accepting appends again", ratio * 100)

    def _is_cleanup_hour(self) -> bool:
        return datetime.fromtimestamp(self._clock_s()).hour == self._config.cleanup_hour

    def _delete_expired(self, force: bool) -> None:
        retention_s = self._config.retention_hours * 3600
        now_s = self._clock_s()
        segments = self._commitlog.segments
        count = 0
        for segment in segments.segments[:-1]:  # never the segment being written
            if count >= self._config.delete_segments_per_pass:
                break
            if not force and now_s - self._last_write_s(segment) < retention_s:
                break
            count += 1
        if count == 0:
            return
        removed = segments.remove_first(count)
        for segment in removed:
            self.log.info(
                "deleting segment %s (%s)",
                segment.path.name,
                "disk pressure" if force else "expired",
            )
        self._doomed.extend(removed)
        self.deleted_segments += len(removed)
        self._finish_doomed()

    @staticmethod
    def _last_write_s(segment: MappedFile) -> float:
        mtime = segment.path.stat().st_mtime
        return max(mtime, segment.last_store_timestamp_ms / 1000)

    def _finish_doomed(self) -> None:
        force_ms = self._config.held_segment_force_delete_ms
        self._doomed = [s for s in self._doomed if not s.try_destroy(force_ms)]

    def on_stop(self) -> None:
        for segment in self._doomed:
            segment.close(unlink=True)
        self._doomed = []

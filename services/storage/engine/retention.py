"""Retention: RocketMQ's CleanCommitLogService, and the disk-full guard.

Every ``cleanup_interval_ms`` it measures the disk holding the commitlog (DiskGuard):
usage is **projected**, what is used plus what the next segment still needs, so that
room for the next roll is made before the roll needs it:

* above ``disk_refuse_writes_ratio`` (90 %) appends are refused with DiskFullError until
  usage drops below it again;
* at the cleanup hour, or above ``disk_clean_ratio`` (75 %), segments older than
  ``retention_hours`` are deleted, oldest first;
* above ``disk_clean_force_ratio`` (85 %) the oldest segments go regardless of age, as
  RocketMQ does, consumed or not: messages that consumer groups had not consumed yet
  (past their committed offsets) are logged as a WARNING naming the topics and groups,
  and counted (``unconsumed_deleted``), see unconsumed.py.

Each pass also asks for the next segment again when creating it ahead of need failed
(a full disk), so a roll finds it ready once there is room.

The segment being written is never deleted. A segment a reader still holds is deleted
when released, or forcibly after ``held_segment_force_delete_ms``. At most
``delete_segments_per_pass`` segments are deleted per pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from services.storage.engine.commitlog import CommitLog
from services.storage.engine.config import StoreConfig
from services.storage.engine.consumer_offsets import ConsumerOffsets
from services.storage.engine.disk_guard import DiskGuard
from services.storage.engine.unconsumed import deleted_queue_ranges, unconsumed_report
from tide.mapped import MappedFile
from tide.service_thread import ServiceThread


class RetentionService(ServiceThread):
    name = "storage.retention"

    def __init__(
        self,
        commitlog: CommitLog,
        config: StoreConfig,
        guard: DiskGuard,
        consumer_offsets: ConsumerOffsets,
        *,
        prepare_next: Callable[[], None] = lambda: None,
        clock_s: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(config.cleanup_interval_ms / 1000)
        self._commitlog = commitlog
        self._config = config
        self._guard = guard
        self._consumer_offsets = consumer_offsets
        self._prepare_next = prepare_next
        self._clock_s = clock_s or time.time
        self._doomed: list[MappedFile] = []
        self.last_ratio = 0.0  # used (as df says), at the last pass
        self.deleted_segments = 0
        self.manual_requests = 0
        self.unconsumed_deleted = 0  # messages past a group's committed offset

    def request_delete(self) -> None:
        """Run a deletion pass now, as if it were the cleanup hour (admin command)."""
        self.manual_requests += 1
        self.wakeup()

    def run_once(self) -> None:
        ratio = self._guard.update()  # projected: with the next segment
        self.last_ratio = self._guard.used_ratio
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
            self._delete_expired(force, ratio)
        self._prepare_next()

    def _is_cleanup_hour(self) -> bool:
        return datetime.fromtimestamp(self._clock_s()).hour == self._config.cleanup_hour

    def _delete_expired(self, force: bool, ratio: float) -> None:
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
        if removed and force:
            self._warn_unconsumed(removed, ratio)
        for segment in removed:  # their marks are no longer needed
            self._commitlog.queue_offsets_at_start.pop(segment.start_offset, None)
        self._doomed.extend(removed)
        self.deleted_segments += len(removed)
        self._finish_doomed()

    def _warn_unconsumed(self, removed: list[MappedFile], ratio: float) -> None:
        """A forced deletion: warn about (and count) the messages consumer groups had not
        consumed yet."""
        marks = self._commitlog.queue_offsets_at_start
        ranges = deleted_queue_ranges(
            removed, marks.get(removed[0].start_offset), marks.get(removed[-1].end_offset)
        )
        report = unconsumed_report(ranges, self._consumer_offsets.committed())
        if not report.messages:
            return
        self.unconsumed_deleted += report.messages
        self.log.warning(
            "disk usage %.1f%% (with the next segment) is above the force-clean threshold "
            "%.0f%%: deleted %d segment(s) holding %d message(s) not yet consumed: %s",
            ratio * 100,
            self._config.disk_clean_force_ratio * 100,
            len(removed),
            report.messages,
            report.describe(),
        )

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

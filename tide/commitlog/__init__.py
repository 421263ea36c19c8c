"""Offline, read-only access to a commitlog directory: iterate over records and verify them.

Nothing here writes; segments are mapped with ``mmap.ACCESS_READ``. See docs/formats.md
("Commitlog segment") for the layout this reads.
"""

from tide.commitlog._layout import (
    COMMITLOG_DIR_NAME,
    CommitlogLayout,
    CommitlogLayoutError,
    NotAStoreError,
    SegmentFile,
    find_commitlog_dir,
    open_segments,
    scan_layout,
    tail_marks_for,
)
from tide.commitlog._mapped import TornTail
from tide.commitlog._reader import (
    CommitlogCorruptionError,
    RecordAt,
    first_store_timestamp_ms,
    iter_records,
)
from tide.commitlog._verify import Finding, ProgressFn, VerifyReport, verify

__all__ = [
    "COMMITLOG_DIR_NAME",
    "CommitlogCorruptionError",
    "CommitlogLayout",
    "CommitlogLayoutError",
    "Finding",
    "NotAStoreError",
    "ProgressFn",
    "RecordAt",
    "SegmentFile",
    "TornTail",
    "VerifyReport",
    "find_commitlog_dir",
    "first_store_timestamp_ms",
    "iter_records",
    "open_segments",
    "scan_layout",
    "tail_marks_for",
    "verify",
]

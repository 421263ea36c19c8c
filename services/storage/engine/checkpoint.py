"""StoreCheckpoint: the 4 KiB ``checkpoint`` file (layout in tide.format).

The storage service records the store time of the last record known flushed. It owns
only the commitlog, so the logics and index timestamps it writes equal the physic one
(dispatch keeps its own progress file); abnormal recovery takes the minimum anyway.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from tide.files import fsync_dir
from tide.format import CHECKPOINT_FILE, CHECKPOINT_FILE_BYTES, Checkpoint

log = logging.getLogger("tide.storage.checkpoint")


class StoreCheckpoint:
    def __init__(self, store_dir: Path) -> None:
        self.path = store_dir / CHECKPOINT_FILE
        self._lock = threading.Lock()
        self.value = self._read()
        self._written = self.value

    def _read(self) -> Checkpoint:
        if not self.path.exists():
            return Checkpoint()
        data = self.path.read_bytes()
        if not data:
            # Only an OS crash between create and first write can leave this (the file is
            # created atomically now); recovery then starts from the first segment.
            log.warning("%s is empty; treating it as absent", self.path)
            return Checkpoint()
        if len(data) != CHECKPOINT_FILE_BYTES:
            raise ValueError(f"{self.path} is {len(data)} bytes, expected {CHECKPOINT_FILE_BYTES}")
        return Checkpoint.unpack(data)

    def set_physic_timestamp(self, timestamp_ms: int) -> None:
        if timestamp_ms <= 0:
            return
        with self._lock:
            self.value = Checkpoint(
                physic_msg_timestamp_ms=timestamp_ms,
                logics_msg_timestamp_ms=timestamp_ms,
                index_msg_timestamp_ms=timestamp_ms,
                master_flushed_offset=self.value.master_flushed_offset,
                confirm_phy_offset=self.value.confirm_phy_offset,
            )

    def flush(self) -> bool:
        """Write and fsync the file if the value changed. True if written."""
        with self._lock:
            value = self.value
        if value == self._written and self.path.exists():
            return False
        if self.path.exists():
            _write_synced(self.path, value.pack(), os.O_RDWR)  # one page, in place
        else:  # first time: whole or not at all
            tmp = self.path.with_name(self.path.name + ".tmp")
            try:
                _write_synced(tmp, value.pack(), os.O_RDWR | os.O_CREAT | os.O_TRUNC)
                os.rename(tmp, self.path)
            except BaseException:
                tmp.unlink(missing_ok=True)  # a full disk: no partial file left behind
                raise
            fsync_dir(self.path.parent)
        self._written = value
        return True


def _write_synced(path: Path, data: bytes, flags: int) -> None:
    fd = os.open(path, flags, 0o644)
    try:
        written = os.pwrite(fd, data, 0)
        assert written == len(data), (written, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)

"""An exclusive, process-lifetime lock on a file (``flock``): one owner per directory."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class FileLockedError(Exception):
    """Another process holds the lock; the message names its pid."""


class FileLock:
    def __init__(self, path: Path, what: str) -> None:
        """``what`` names the locked thing in errors (e.g. "store /data/store")."""
        self.path = path
        self._what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock at once or raise :class:`FileLockedError`; records our pid."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise FileLockedError(
                f"{self._what} is in use by another process (pid {holder}); "
                "stop it or choose another --store-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

"""The ``lock`` and ``abort`` files of a store root.

``lock`` is held with an exclusive ``flock`` for the life of the process, so a second
process on the same store fails at once. ``abort`` exists while the store is open; if it
is there at start, the last process did not close cleanly and recovery is abnormal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from services.storage.engine.errors import StoreLockedError
from tide.files import fsync_dir

LOCK_FILE = "lock"
ABORT_FILE = "abort"


class StoreLock:
    def __init__(self, store_dir: Path) -> None:
        self.path = store_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLockedError(
                f"store {self.path.parent} is in use by another process (pid {holder}); "
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


def abort_file_exists(store_dir: Path) -> bool:
    return (store_dir / ABORT_FILE).exists()


def create_abort_file(store_dir: Path) -> None:
    path = store_dir / ABORT_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(store_dir)


def remove_abort_file(store_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (store_dir / ABORT_FILE).unlink()
    fsync_dir(store_dir)

"""The ``lock`` and ``abort`` files of a store root.

``lock`` is held with an exclusive ``flock`` for the life of the process, so a second
process on the same store fails at once. ``abort`` exists while the store is open; if it
is there at start, the last process did not close cleanly and recovery is abnormal.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from services.storage.engine.errors import StoreLockedError
from tide.files import FileLock, FileLockedError, fsync_dir
from tide.format import ABORT_FILE

LOCK_FILE = "lock"


class StoreLock:
    """The store's ``lock`` file; a second process fails at once with StoreLockedError."""

    def __init__(self, store_dir: Path) -> None:
        self._lock = FileLock(store_dir / LOCK_FILE, f"store {store_dir}")
        self.path = self._lock.path

    def acquire(self) -> None:
        try:
            self._lock.acquire()
        except FileLockedError as exc:
            raise StoreLockedError(str(exc)) from None

    def release(self) -> None:
        self._lock.release()


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

"""Free space on a store's disk, and telling "the disk is full" from other I/O errors.

Both services meet a full disk the same way (ENOSPC from ``posix_fallocate``, ``write``,
``fsync``, ``rename``; EDQUOT when a quota is reached): it is not a bug of the store but a
state the operator fixes by freeing space, so the error answers RESOURCE_EXHAUSTED with a
message naming the directory and its free space (:func:`describe_space`).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

OUT_OF_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_out_of_space(exc: BaseException) -> bool:
    """True for an OSError that means the disk (or the quota) is full."""
    return isinstance(exc, OSError) and exc.errno in OUT_OF_SPACE_ERRNOS


class OutOfSpaceError(OSError):
    """ENOSPC (or EDQUOT) creating or writing a file; nothing partial of it is left."""


def check_room(directory: Path, size_bytes: int, path: Path) -> None:
    """Raise OutOfSpaceError, before anything is written, when the filesystem holding
    ``directory`` has fewer than ``size_bytes`` free for ``path``: retrying a creation
    on a full disk then costs a ``statvfs``, not a partial allocation undone."""
    if disk_space(directory).free_bytes < size_bytes:
        raise OutOfSpaceError(
            errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {size_bytes} bytes needed", str(path)
        )


def allocate_file(path: Path, size_bytes: int, *, reserve: bool = True) -> None:
    """Create ``path`` (a temporary name: the caller renames or links it into place)
    ``size_bytes`` long with its blocks reserved (``reserve``: posix_fallocate, so a full
    disk fails here, not as SIGBUS when a mapping is written). The free space is checked
    first (:func:`check_room`); a partly allocated file is removed, not left to hold the
    space. ``reserve=False``: a sparse file, nothing checked."""
    if reserve:
        check_room(path.parent, size_bytes, path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size_bytes)
            if reserve:
                os.posix_fallocate(fd, 0, size_bytes)
        finally:
            os.close(fd)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


@dataclass(frozen=True, slots=True)
class DiskSpace:
    """The filesystem holding a directory, as ``df`` counts it."""

    total_bytes: int  # used + available to unprivileged users
    free_bytes: int  # available to unprivileged users
    used_bytes: int

    @property
    def used_ratio(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0

    def projected_ratio(self, needed_bytes: int) -> float:
        """The used fraction once ``needed_bytes`` more are allocated."""
        if not self.total_bytes:
            return 0.0
        return (self.used_bytes + needed_bytes) / self.total_bytes


def disk_space(path: Path) -> DiskSpace:
    """Space of the filesystem holding ``path`` (df's Use%: reserved blocks excluded)."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return DiskSpace(total_bytes=used + free, free_bytes=free, used_bytes=used)


def describe_space(path: Path) -> str:
    """ "N MiB free of M MiB", or why that cannot be said (the directory is gone)."""
    try:
        space = disk_space(path)
    except OSError as exc:
        return f"free space unknown: {exc.strerror}"
    return f"{_mib(space.free_bytes)} free of {_mib(space.total_bytes)}"


def _mib(size_bytes: int) -> str:
    return f"{size_bytes / (1 << 20):.1f} MiB"

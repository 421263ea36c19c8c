"""A real small disk for disk-full tests: a tmpfs mounted for one test (we run as root
in tests and CI), unmounted in teardown; the test is skipped, saying why, only where
mounting is impossible."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

FILL_CHUNK_BYTES = 1 << 20


@contextmanager
def mounted_tmpfs(directory: Path, size_bytes: int) -> Iterator[Path]:
    """``directory`` as a tmpfs of ``size_bytes``; unmounted on exit (the processes
    using it must have stopped by then)."""
    if os.geteuid() != 0:
        pytest.skip("disk-full tests mount a tmpfs, which needs root")
    if shutil.which("mount") is None:
        pytest.skip("disk-full tests mount a tmpfs: no mount command here")
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs on {directory}: {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        done = subprocess.run(["umount", str(directory)], capture_output=True, check=False)
        if done.returncode:  # still busy (a process being reaped): detach it anyway
            subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)


def free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave_free_bytes: int) -> int:
    """Write ``path`` until its filesystem has about ``leave_free_bytes`` free (never
    less: the write stops short of that); returns the bytes written."""
    written = 0
    with path.open("wb") as out:
        while (room := free_bytes(path.parent) - leave_free_bytes) > 0:
            chunk = min(FILL_CHUNK_BYTES, room)
            out.write(bytes(chunk))
            out.flush()
            written += chunk
    return written

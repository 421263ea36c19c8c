"""Creating segment files: preallocated blocks, optional warm-up.

A new segment is written under a temporary name and renamed into place, so a crash
during creation never leaves a short segment. ``posix_fallocate`` reserves the blocks
(a full disk fails here, not later as SIGBUS on a page fault while appending) and makes
the first touch of a page several times cheaper. Warm-up additionally writes zeros
through the file descriptor (so the pages are in the page cache), then tries
``mlock`` and ``madvise(WILLNEED)``; a refusal by the OS is logged, not fatal. Every
syscall here releases the GIL.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
from pathlib import Path

from services.storage.engine.mapped_file import MappedFile
from tide.format import segment_name

log = logging.getLogger("tide.storage.segment_files")
ALLOC_SUFFIX = ".alloc"
_WARM_CHUNK_BYTES = 1 << 20


def create_segment(
    directory: Path, start_offset: int, size_bytes: int, *, preallocate: bool, warm: bool
) -> MappedFile:
    path = directory / segment_name(start_offset)
    if path.exists():
        raise FileExistsError(f"segment {path} already exists")
    tmp = path.with_name(path.name + ALLOC_SUFFIX)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size_bytes)
        if preallocate or warm:
            os.posix_fallocate(fd, 0, size_bytes)
        if warm:
            zeros = bytes(_WARM_CHUNK_BYTES)
            for pos in range(0, size_bytes, _WARM_CHUNK_BYTES):
                os.pwrite(fd, zeros[: min(_WARM_CHUNK_BYTES, size_bytes - pos)], pos)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    _fsync_dir(directory)
    segment = MappedFile(path, start_offset, size_bytes)
    if warm:
        lock_in_memory(segment.mm, size_bytes)
    return segment


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name, use_errno=True) if name else None
    return _libc


def lock_in_memory(mm: mmap.mmap, size_bytes: int) -> bool:
    """mlock + madvise(WILLNEED) the mapping; log and go on where the OS refuses."""
    try:
        mm.madvise(mmap.MADV_WILLNEED)
    except OSError as exc:
        log.warning("madvise(WILLNEED) refused: %s; continuing without it", exc)
    libc = _load_libc()
    if libc is None:
        log.warning("libc not found; cannot mlock segments")
        return False
    address = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    result = libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(size_bytes))
    if result != 0:
        err = ctypes.get_errno()
        log.warning(
            "mlock of %d bytes refused (%s); raise RLIMIT_MEMLOCK to pin segments",
            size_bytes,
            os.strerror(err),
        )
        return False
    return True


def remove_leftover_allocations(directory: Path) -> list[Path]:
    """Delete half-created segments left by a crash during allocation."""
    removed = []
    for path in directory.glob("*" + ALLOC_SUFFIX):
        log.info("removing half-created segment %s", path.name)
        path.unlink()
        removed.append(path)
    return removed

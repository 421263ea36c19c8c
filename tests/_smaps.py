"""What the kernel says of mappings and the page cache; taking a file's pages out of memory."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

PAGE_BYTES = 4096


def dirty_pages(path: Path) -> int:
    """Pages of this process's mapping of ``path`` the kernel counts dirty (Shared_Dirty
    plus Private_Dirty: written through the mapping and not written back since)."""
    return _smaps_pages(path, ("Shared_Dirty", "Private_Dirty"))


def mapped_pages(path: Path) -> int:
    """Pages of this process's mapping of ``path`` in its page tables (Rss)."""
    return _smaps_pages(path, ("Rss",))


def present_pages(pid: int, path: Path, position: int, size: int) -> int:
    """How many pages of ``[position, position + size)`` of process ``pid``'s mapping of
    ``path`` (its first, from the file's start) are in its page tables: the present bit
    of /proc/PID/pagemap (a page in the page cache that the process never faulted on, or
    read with ``pread``, is not)."""
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        if line.endswith(" " + str(path)) and int(fields[2], 16) == 0:
            start = int(fields[0].split("-")[0], 16)
            break
    else:
        raise AssertionError(f"process {pid} does not map {path} from its start")
    first = (start + position) // PAGE_BYTES
    count = -(-(start + position + size) // PAGE_BYTES) - first
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        words = memoryview(pagemap.read(count * 8)).cast("Q")
    return sum(word >> 63 for word in words)


def _smaps_pages(path: Path, fields: tuple[str, ...]) -> int:
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for at, line in enumerate(lines):
        if line.endswith(" " + str(path)):
            kib = 0
            for field in lines[at + 1 :]:
                name, colon, value = field.partition(":")
                if not colon or " " in name:  # the next mapping's header line
                    break
                if name in fields:
                    kib += int(value.split()[0])
            return kib * 1024 // PAGE_BYTES
    raise AssertionError(f"{path} is not mapped by this process")


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_SYS_PROCESS_MADVISE = 440  # x86_64 and arm64 (asm-generic)
_MADV_PAGEOUT = 21


# Rounds of evict: pages read moments ago may still sit in another CPU's batch of pages
# not yet on the LRU lists, which MADV_PAGEOUT cannot take; the fadvise of a round whose
# pages stayed drains every CPU's batch (lru_add_drain_all), so the next round takes them.
_EVICT_ROUNDS = 5


def evict(pid: int, path: Path) -> None:
    """Take ``path``'s pages out of memory although process ``pid`` maps it: page out its
    mappings of the file (process_madvise MADV_PAGEOUT), then drop the file's pages from
    the page cache, again while some stay (at most ``_EVICT_ROUNDS`` times; the caller
    checks ``resident_pages``). The pages must be clean (written back) to go."""
    size = path.stat().st_size
    for _ in range(_EVICT_ROUNDS):
        _evict_once(pid, path)
        if resident_pages(path, 0, size) == 0:
            return


def _evict_once(pid: int, path: Path) -> None:
    ranges = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if line.endswith(" " + str(path)):
            low, high = (int(x, 16) for x in line.split()[0].split("-"))
            ranges.append(_IoVec(low, high - low))
    assert ranges, f"process {pid} does not map {path}"
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        vector = (_IoVec * len(ranges))(*ranges)
        paged = libc.syscall(_SYS_PROCESS_MADVISE, pidfd, vector, len(ranges), _MADV_PAGEOUT, 0)
        assert paged >= 0, f"process_madvise: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(pidfd)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_pages(path: Path, position: int, size: int) -> int:
    """How many pages of ``path``'s ``[position, position + size)`` are in the page
    cache (mincore over a mapping of this process that touches none of them)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        mapping = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    try:
        first = position - position % PAGE_BYTES
        pages = (ctypes.c_ubyte * -(-(position + size - first) // PAGE_BYTES))()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapping)) + first
        libc = ctypes.CDLL(None, use_errno=True)
        assert (
            libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(len(pages) * PAGE_BYTES), pages)
            == 0
        )
        return sum(page & 1 for page in pages)
    finally:
        mapping.close()

"""MappedFile: one commitlog segment, memory-mapped, with wrote/committed/flushed positions.

Positions are byte offsets inside the segment:

* ``wrote``: end of the last appended record (set by the appender, under the append lock);
* ``committed``: end of what is in the file (equals ``wrote`` unless a write buffer from
  the pool is attached; then the commit thread moves bytes into the file);
* ``flushed``: end of what a flush has made durable.

Invariant: ``flushed <= committed <= wrote <= size``. Readers see ``committed``.

Reads slice the mapping, except on a thread marked by :func:`read_through_file`: there
they ``pread`` the file. A read of pages not in memory faults them in from the disk, and
a fault holds the GIL for the whole disk read (every thread of the process waits); a
``pread`` waits for the disk with the GIL released. :meth:`MappedFile.resident` says
whether a range is in memory (``mincore``), so a caller can send a read that is not to
such a thread (tide.server.ColdReads: the storage's and the dispatch's cold reads).

A flush makes ``[flushed, committed)`` durable and nothing else: ``msync(MS_SYNC)`` over
that range of the mapping (on Linux the kernel's ranged fsync with fdatasync's
semantics, ``vfs_fsync_range(file, start, end, datasync=1)``: the range's pages written
back, the journal committed for them, the disk cache flushed), called through ctypes,
which releases the GIL as ``os.fdatasync`` does (``mmap.flush`` calls msync too but holds
the GIL). Not ``fdatasync`` of the whole file: a warmed segment's pages ahead of the
writer are dirty (``MADV_POPULATE_WRITE`` dirtied them with zeros), and a whole-file
sync writes those zeros to disk and write-protects the pages again, so the writer's
first store into each later page faults into the filesystem (ext4's ``page_mkwrite``)
on the event loop's thread, the very fault the warm-up is there to take off it.
Measured on the 2-core box (a 128 MiB warmed segment, 23 KB stores ~1,000 a second, a
sync every 500 ms): 13.2-22.5 us a store after whole-file syncs, 2.8-4.8 us after
ranged ones, 2.5-5.3 us with no sync at all (docs/benchmarks.md). :meth:`sync`
(recovery, truncation) still syncs the whole file: there the bytes to make durable may
lie past the positions.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tide.format import data_end, segment_name

PAGE_BYTES = 4096  # the unit of "least pages" in flush and commit policies
_MS_SYNC = 4  # sys/mman.h (Linux); Python's mmap module does not export it

log = logging.getLogger("tide.mapped")


class MappedFile:
    def __init__(self, path: Path, start_offset: int, size_bytes: int) -> None:
        """Map an existing file of exactly ``size_bytes`` bytes."""
        self.path = path
        self.start_offset = start_offset
        self.size_bytes = size_bytes
        self._fd = os.open(path, os.O_RDWR)
        actual = os.fstat(self._fd).st_size
        if actual != size_bytes:
            os.close(self._fd)
            raise ValueError(f"{path} is {actual} bytes, expected {size_bytes}")
        self.mm = mmap.mmap(self._fd, size_bytes, flags=mmap.MAP_SHARED)
        # The mapping's address, for the C library's calls on it (msync, mincore; the
        # storage's madvise and mlock). The temporary ctypes object exports the buffer
        # only for this expression (an export alive would make mm.close() fail).
        self.address: int = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        self.wrote = 0
        self.committed = 0
        self.flushed = 0
        self.last_store_timestamp_ms = 0
        # Write buffer from the pool; None when appends go straight to the mapping.
        self.write_buffer: bytearray | None = None
        self.locked = False  # mlock'ed by warm-up
        # Position of the end-of-segment blank marker: set by the writer, found on demand
        # for a full segment written before this process (-1: none found).
        self.blank_position: int | None = None
        # Commit and flush can be called from two threads (commit service and group
        # commit); a position must never move backwards.
        self._commit_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._holds = 0
        self._holds_lock = threading.Lock()
        self._destroy_requested_at: float | None = None
        self.closed = False

    @property
    def fileno(self) -> int:
        return self._fd

    # -- positions ---------------------------------------------------------------
    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size_bytes

    @property
    def is_full(self) -> bool:
        return self.wrote == self.size_bytes

    def set_positions(self, position: int) -> None:
        """Set every position (recovery, truncation)."""
        assert 0 <= position <= self.size_bytes, position
        self.wrote = self.committed = self.flushed = position

    # -- writing -----------------------------------------------------------------
    @property
    def write_target(self) -> bytearray | mmap.mmap:
        """Where appends go: the pooled buffer if attached, else the mapping."""
        return self.write_buffer if self.write_buffer is not None else self.mm

    def commit(self, least_pages: int) -> bool:
        """Move buffered bytes into the file (write buffer only). True if it did work."""
        buf = self.write_buffer
        if buf is None:
            self.committed = self.wrote
            return False
        with self._commit_lock:
            wrote, committed = self.wrote, self.committed
            if wrote == committed or (least_pages and wrote - committed < least_pages * PAGE_BYTES):
                return False
            with memoryview(buf) as view:
                written = os.pwrite(self._fd, view[committed:wrote], committed)  # no GIL
            assert written == wrote - committed, (written, wrote, committed)
            self.committed = wrote
            return True

    def flush(self, least_pages: int) -> bool:
        """Make ``[flushed, committed)`` durable if at least ``least_pages`` pages of it
        are dirty (0: any). True if synced."""
        with self._flush_lock:
            committed, flushed = self.committed, self.flushed
            dirty = committed - flushed
            if self.closed or dirty <= 0 or (least_pages and dirty < least_pages * PAGE_BYTES):
                return False
            self._sync_range(flushed, committed)
            self.flushed = committed
            return True

    def _sync_range(self, start: int, end: int) -> None:
        """msync(MS_SYNC) the pages holding ``[start, end)`` (see the module's docstring);
        fdatasync where the C library has no msync."""
        if _msync is None:
            os.fdatasync(self._fd)
            return
        first = start - start % mmap.PAGESIZE  # msync wants a page-aligned address
        assert 0 <= first < end <= self.size_bytes, (start, end, self.size_bytes)
        if _msync(self.address + first, end - first, _MS_SYNC) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"msync of {self.path}: {os.strerror(err)}")

    def detach_write_buffer(self) -> bytearray | None:
        """Give the pooled buffer back once everything in it is committed."""
        buf = self.write_buffer
        if buf is not None and self.committed == self.wrote == self.size_bytes:
            self.write_buffer = None
            return buf
        return None

    def data_extent(self) -> int:
        """Position just past the last non-zero byte of the file."""
        return data_end(self.mm, 0, self.size_bytes)

    def zero_from(self, position: int) -> int:
        """Zero the file from ``position`` (a truncated tail must not be mistaken for
        records after a later crash). Returns how many bytes held data."""
        extent = self.data_extent()
        if extent > position:
            chunk_bytes = 1 << 20
            for pos in range(position, extent, chunk_bytes):
                os.pwrite(self._fd, bytes(min(chunk_bytes, extent - pos)), pos)
        if self.write_buffer is not None:
            self.write_buffer[position:] = bytes(self.size_bytes - position)
        return max(0, extent - position)

    def sync(self) -> None:
        """fdatasync now, whatever the positions say (after recovery)."""
        os.fdatasync(self._fd)

    # -- reading and lifetime ----------------------------------------------------
    def read(self, position: int, size: int) -> bytes:
        """``size`` bytes at ``position``: from the mapping, or with ``pread`` on a thread
        marked by :func:`read_through_file`."""
        if _thread.through_file:  # reads_through_file(), without a call on the hot path
            data = os.pread(self._fd, size, position)  # the GIL released for the disk
            if len(data) != size:  # the file is never shorter than the mapping
                raise OSError(f"{self.path}: read {len(data)} of {size} bytes at {position}")
            return data
        return self.mm[position : position + size]

    def resident(self, position: int, size: int) -> bool:
        """Whether every page of ``[position, position + size)`` is in memory (mincore),
        so that reading it from the mapping takes no disk read. True where that cannot be
        told (no mincore, a closed file): the mapping is read as before."""
        if _mincore is None or self.closed or size <= 0:
            return True
        first = position - position % mmap.PAGESIZE
        length = position + size - first
        pages = (ctypes.c_ubyte * -(-length // mmap.PAGESIZE))()
        if _mincore(self.address + first, length, pages) != 0:
            return True
        # Only the low bit of each byte is defined (resident); the others are reserved.
        return _NOT_RESIDENT not in bytes(pages).translate(_LOW_BIT)

    def hold(self) -> bool:
        """Pin the mapping for a reader; False if it is being destroyed."""
        with self._holds_lock:
            if self._destroy_requested_at is not None or self.closed:
                return False
            self._holds += 1
            return True

    def release(self) -> None:
        with self._holds_lock:
            assert self._holds > 0
            self._holds -= 1

    def try_destroy(self, force_after_ms: int, now_s: float | None = None) -> bool:
        """Close and delete the file once no reader holds it, or after ``force_after_ms``."""
        now_s = time.monotonic() if now_s is None else now_s
        with self._holds_lock:
            if self._destroy_requested_at is None:
                self._destroy_requested_at = now_s
            held = self._holds > 0
            waited_ms = (now_s - self._destroy_requested_at) * 1000
            if held and waited_ms < force_after_ms:
                return False
            if held:
                log.warning(
                    "deleting %s while %d reader(s) still hold it (waited %.0f ms)",
                    self.path.name,
                    self._holds,
                    waited_ms,
                )
        self.close(unlink=True)
        return True

    def close(self, *, unlink: bool = False) -> None:
        with self._flush_lock:  # no flush is syncing the mapping while it goes
            if self.closed:
                return
            self.closed = True
        try:
            self.mm.close()
        except BufferError:
            # A reader still has a view: the mapping stays valid until it drops it.
            log.warning("%s still has live views; unmapping when they are released", self.path)
        os.close(self._fd)
        if unlink:
            self.path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return (
            f"MappedFile({segment_name(self.start_offset)}, wrote={self.wrote}, "
            f"committed={self.committed}, flushed={self.flushed})"
        )


def read_through_file() -> None:
    """Mark the calling thread: its :meth:`MappedFile.read` calls ``pread`` the file (the
    GIL released while the disk answers) instead of slicing the mapping. For the threads
    that read what may not be in memory; a thread pool's initializer."""
    _thread.through_file = True


def reads_through_file() -> bool:
    """Whether the calling thread was marked by :func:`read_through_file`."""
    return _thread.through_file


class _ThreadMarks(threading.local):
    """A thread's marks. The class attribute is every thread's default, so reading it is
    a plain attribute lookup, on the path of every read of a mapped file (timeit here,
    each through a call: 63 ns, against 413 ns for ``getattr`` with a default)."""

    through_file = False


_thread = _ThreadMarks()
_LOW_BIT = bytes(i & 1 for i in range(256))
_NOT_RESIDENT = b"\0"


def _libc_function(name: str, *argtypes: type) -> Any:
    """The C library's function ``name`` with its signature declared, or None."""
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


_msync: Callable[[int, int, int], int] | None = _libc_function(
    "msync", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
)
_mincore: Callable[[int, int, Any], int] | None = _libc_function(
    "mincore", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p
)

"""glibc allocator settings for services that move megabyte-sized buffers.

A Tail chunk, a replication batch or a large Read answer is a buffer of up to a few MiB.
glibc serves allocations above its mmap threshold (128 KiB at first, raised on the fly
up to 32 MiB) with a fresh ``mmap`` and returns them with ``munmap``, so every such
buffer costs its pages' first-touch faults again (2.5-9 us a page on the reference VM).
Fixing the threshold at :data:`MMAP_THRESHOLD_BYTES` keeps those buffers in the heap,
where freed memory is reused, and :data:`TRIM_THRESHOLD_BYTES` keeps the heap from
being returned to the kernel after every burst. The memory held stays bounded by the
service's own limits on chunk and batch sizes.

Only glibc has ``mallopt``; elsewhere (musl) nothing is changed and that is logged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("tide.server.malloc")

MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 128 << 20
# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_malloc() -> bool:
    """Set the thresholds; True when glibc accepted both."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        log.info("no mallopt in the C library (%s): allocator thresholds left as they are", name)
        return False
    accepted: bool = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    accepted = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and accepted
    if not accepted:
        log.warning("mallopt refused the allocator thresholds; buffers keep glibc's defaults")
    return accepted

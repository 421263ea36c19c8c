"""MappedFile's flush and reads, checked against what the kernel says of the mapping.

A flush syncs the range written since the last flush and nothing else: the pages past
``committed`` must stay dirty (writable) through it, since a warmed segment's pages
ahead of the writer were dirtied with zeros, and a flush that wrote them back would
write-protect them again, so the writer would fault on each (the warm-up undone).
``resident`` says whether a range is in memory, and a thread marked to read through the
file reads with pread, mapping no page (a fault would hold the GIL for a disk read).
The kernel says which pages of a mapping are dirty or mapped in /proc/self/smaps.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._smaps import dirty_pages as dirty_pages_of
from tests._smaps import mapped_pages
from tide.mapped import PAGE_BYTES, MappedFile, read_through_file, reads_through_file

SIZE_BYTES = 64 * PAGE_BYTES


@pytest.fixture
def mapped(tmp_path: Path) -> Iterator[MappedFile]:
    path = tmp_path / "00000000000000000000"
    with path.open("wb") as file:
        file.truncate(SIZE_BYTES)
    mf = MappedFile(path, 0, SIZE_BYTES)
    yield mf
    mf.close()


def dirty_pages(mf: MappedFile) -> int:
    return dirty_pages_of(mf.path)


def write_every_page(mf: MappedFile) -> None:
    """Dirty every page, as the warm-up's MADV_POPULATE_WRITE does."""
    for pos in range(0, SIZE_BYTES, PAGE_BYTES):
        mf.mm[pos] = 1
    assert dirty_pages(mf) == SIZE_BYTES // PAGE_BYTES


def test_flush_leaves_the_pages_past_committed_dirty(mapped: MappedFile) -> None:
    write_every_page(mapped)
    mapped.wrote = mapped.committed = 8 * PAGE_BYTES
    assert mapped.flush(0)
    assert mapped.flushed == 8 * PAGE_BYTES
    assert dirty_pages(mapped) == SIZE_BYTES // PAGE_BYTES - 8


def test_flush_syncs_from_the_page_holding_the_flushed_position(mapped: MappedFile) -> None:
    write_every_page(mapped)
    mapped.set_positions(PAGE_BYTES + 100)  # flushed in page 1: page 0 is not synced
    mapped.wrote = mapped.committed = 2 * PAGE_BYTES + 100  # ends in page 2
    assert mapped.flush(0)
    assert mapped.flushed == 2 * PAGE_BYTES + 100
    assert dirty_pages(mapped) == SIZE_BYTES // PAGE_BYTES - 2  # pages 1 and 2


def test_flush_waits_for_least_pages(mapped: MappedFile) -> None:
    write_every_page(mapped)
    mapped.wrote = mapped.committed = 3 * PAGE_BYTES
    assert not mapped.flush(4)
    assert mapped.flushed == 0
    assert dirty_pages(mapped) == SIZE_BYTES // PAGE_BYTES
    assert mapped.flush(3)
    assert not mapped.flush(0)  # nothing new


def test_sync_writes_back_the_whole_file(mapped: MappedFile) -> None:
    write_every_page(mapped)
    mapped.sync()
    assert dirty_pages(mapped) == 0


def test_what_a_flush_synced_reads_back_through_the_file(mapped: MappedFile) -> None:
    mapped.mm[0:5] = b"tide!"
    mapped.wrote = mapped.committed = 5
    assert mapped.flush(0)
    assert os.pread(mapped.fileno, 5, 0) == b"tide!"


def test_flush_after_close_does_nothing(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    path.write_bytes(bytes(SIZE_BYTES))
    mf = MappedFile(path, 0, SIZE_BYTES)
    mf.wrote = mf.committed = 10
    mf.close()
    assert not mf.flush(0)
    assert mf.flushed == 0


def drop_from_memory(mf: MappedFile) -> None:
    """Unmap the pages of ``mf`` from this process and drop them from the page cache."""
    mf.mm.madvise(mmap.MADV_DONTNEED)
    os.posix_fadvise(mf.fileno, 0, 0, os.POSIX_FADV_DONTNEED)


def test_resident_says_whether_a_range_is_in_memory(mapped: MappedFile) -> None:
    mapped.mm[: 4 * PAGE_BYTES] = b"r" * 4 * PAGE_BYTES
    mapped.sync()  # clean pages can be dropped
    assert mapped.resident(0, 4 * PAGE_BYTES)
    drop_from_memory(mapped)
    assert not mapped.resident(0, 4 * PAGE_BYTES)
    assert not mapped.resident(PAGE_BYTES + 10, 1)
    assert mapped.read(2 * PAGE_BYTES, 3) == b"rrr"  # through the mapping: faulted in
    assert mapped.resident(2 * PAGE_BYTES, PAGE_BYTES)
    assert mapped.resident(2 * PAGE_BYTES + 7, 100)
    assert mapped.resident(0, 0)


def test_a_thread_marked_to_read_through_the_file_maps_no_page(mapped: MappedFile) -> None:
    data = bytes(range(256)) * (4 * PAGE_BYTES // 256)
    mapped.mm[: len(data)] = data
    mapped.sync()
    drop_from_memory(mapped)
    assert mapped_pages(mapped.path) == 0
    read: list[bytes] = []

    def cold_reader() -> None:
        read_through_file()
        assert reads_through_file()
        read.append(mapped.read(100, len(data) - 100))

    thread = threading.Thread(target=cold_reader)
    thread.start()
    thread.join()
    assert read == [data[100:]]
    assert mapped_pages(mapped.path) == 0  # pread: the page cache, not this mapping
    assert not reads_through_file()  # the mark is the thread's own
    assert mapped.read(100, 10) == data[100:110]
    assert mapped_pages(mapped.path) >= 1

"""The key index of the dispatch service: RocketMQ's ``IndexService`` over index files.

Files live in ``root/index/``, each named ``index_file_name(creation_ms)`` and exactly
``geometry.file_bytes`` long (docs/formats.md, "Index file"; the layout itself is
:mod:`tide.format._index_file`). Names sort in creation order and the list is kept in that
order, so the newest file is the last one and the only one written.

Indexing (:meth:`IndexService.build`) follows ``IndexService.buildIndex``: rollback
transaction records are skipped, ``topic#UNIQ_KEY`` and ``topic#key`` for every key of
``KEYS`` are put into the newest file, and a full file makes a new one whose header
continues from the full file's end values. A record at or below the last indexed commitlog
offset (the newest file's ``end_phy_offset``) is skipped entirely, so when the dispatcher
re-reads a commitlog range (restart, retry) index puts are never duplicated. RocketMQ skips
only records strictly below it; ``<=`` is used here so the last record is not put twice.
The price, shared with RocketMQ: a record whose keys were only partly put (a crash between
two keys of one record) is not completed on re-dispatch. So that a full disk cannot stop
a batch there, the files a batch will roll to are preallocated (under temporary names)
before any of its keys is put.

Lookups (:meth:`IndexService.query`) follow ``IndexService.queryOffset``: files newest to
oldest, only those whose time range overlaps the asked one, stopping at ``max_count`` or at
the first file that begins before the asked range. Only key hashes are stored, so the
offsets are *candidates*: the caller must read each message and check its real keys.

Threads: one writer (the dispatcher) calls :meth:`build`, :meth:`truncate_past`,
:meth:`delete_below`, :meth:`load` and :meth:`close` (serialized by a writer lock anyway);
:meth:`query`, :meth:`status` and :meth:`flush` may run on other threads. The file list is
guarded by a lock held only to copy or change the list; a reader then pins each file it
reads with ``MappedFile.hold`` / ``release``, so a file deleted meanwhile is unlinked at once
but unmapped only once no reader holds it (or after :data:`DESTROY_FORCE_AFTER_MS`).
Entries are written in place while readers read. A batch of keys (:meth:`build_keys`,
:func:`tide.format.put_keys`, here through ``tide.format.put_key_batch``, compiled) writes its
entries, then its slots, then the header once, as ``put_key`` does for one key (so a
crash in between leaves what ``put_key`` repairs); meanwhile a slot may name an entry
the header does not count yet, which a reader takes for an empty chain. So batches are
counted (``_writes``, odd while one runs) and a query that overlapped one asks again
with the writer lock held.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tide.files import allocate_file, fsync_dir
from tide.format import (
    INDEX_HEADER_BYTES,
    MAX_PROPERTIES_BYTES,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_ROLLBACK,
    IndexGeometry,
    IndexHeader,
    index_file_name,
    index_key,
    index_key_hash,
    index_time_matched,
    init_index_header,
    is_index_full,
    parse_index_file_name,
    put_key_batch,
    read_index_header,
    select_phy_offsets,
)
from tide.limits import KEY_MAX_CHARS
from tide.mapped import MappedFile

INDEX_DIR_NAME = "index"
MAX_INDEX_FILES = 10_000
MAX_QUERY_COUNT = 64 * 1024
# Longest key accepted by query: produce refuses longer keys (one limit: tide.limits).
MAX_QUERY_KEY_CHARS = KEY_MAX_CHARS
# RocketMQ destroys index files with ``destroy(3000)``: readers get 3 s to let go.
DESTROY_FORCE_AFTER_MS = 3000
TMP_FILE_NAME = ".index-file.tmp"
# How many creation times are tried when names collide (same ms, clock going back).
_NAME_TRIES = 1000
NO_OFFSET = -1  # "nothing indexed"

log = logging.getLogger("tide.dispatch.index")


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class IndexStatus:
    files: int
    entries: int  # keys put, over every file
    last_indexed_offset: int  # NO_OFFSET when nothing is indexed
    last_timestamp_ms: int  # the newest file's end timestamp, 0 when there is none
    pending_destroys: int  # deleted files still mapped by a reader


class _IndexFile:
    """One mapped index file and whether it has writes that were not fdatasync'ed."""

    __slots__ = ("dirty", "mf", "name")

    def __init__(self, name: str, mf: MappedFile) -> None:
        self.name = name
        self.mf = mf
        self.dirty = False

    def header(self) -> IndexHeader:
        return read_index_header(self.mf.mm)


class IndexService:
    def __init__(
        self,
        root: Path,
        geometry: IndexGeometry | None = None,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        *,
        max_files: int = MAX_INDEX_FILES,
    ) -> None:
        if not 1 <= max_files <= MAX_INDEX_FILES:
            raise ValueError(f"max_files {max_files} must be in 1..{MAX_INDEX_FILES}")
        self.directory = root / INDEX_DIR_NAME
        self.geometry = geometry if geometry is not None else IndexGeometry()
        self._clock_ms = clock_ms
        self._max_files = max_files
        self._files: list[_IndexFile] = []  # oldest first; guarded by _list_lock
        self._pending: list[_IndexFile] = []  # deleted, waiting for readers; writer only
        self._list_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._last_indexed = NO_OFFSET
        # Counts batch writes, twice each (odd while one runs): a query that overlapped
        # one may have read a slot naming an entry the header does not count yet.
        self._writes = 0
        self._loaded = False
        self._closed = False

    # -- loading -------------------------------------------------------------------
    def load(self) -> None:
        """Map the files of ``root/index/`` (created if missing), oldest first.

        Raises ValueError naming the file for a file of the wrong size, an unknown name,
        a header that does not fit the geometry, or files whose offsets go backwards.
        """
        with self._write_lock:
            self._check_usable(loading=True)
            self.directory.mkdir(parents=True, exist_ok=True)
            files: list[_IndexFile] = []
            try:
                for name in self._scan_names():
                    files.append(self._open(name))
                _check_order(files)
            except BaseException:
                for f in files:
                    f.mf.close()
                raise
            with self._list_lock:
                self._files = files
            self._last_indexed = self._compute_last_indexed()
            self._loaded = True
            log.info("loaded %d index file(s) from %s", len(files), self.directory)

    def _scan_names(self) -> list[str]:
        names: list[str] = []
        for path in self.directory.iterdir():
            if path.name.startswith(TMP_FILE_NAME):  # a creation interrupted by a crash
                path.unlink()
                continue
            if not path.is_file() or parse_index_file_name(path.name) is None:
                raise ValueError(f"unexpected entry {path} in the index directory")
            names.append(path.name)
            if len(names) > self._max_files:
                raise ValueError(f"{self.directory} holds more than {self._max_files} files")
        return sorted(names)

    def _open(self, name: str) -> _IndexFile:
        path = self.directory / name
        size = path.stat().st_size
        geometry = self.geometry
        if size != geometry.file_bytes:
            raise ValueError(
                f"index file {path} is {size} bytes, expected {geometry.file_bytes} "
                f"({geometry.slot_count} slots, {geometry.max_entries} entries)"
            )
        f = _IndexFile(name, MappedFile(path, 0, size))
        header = f.header()
        if header.index_count > geometry.max_entries:
            f.mf.close()
            raise ValueError(
                f"index file {path}: index_count {header.index_count} does not fit "
                f"{geometry.max_entries} entries"
            )
        return f

    # -- indexing ------------------------------------------------------------------
    def build(
        self,
        record_phys_offset: int,
        store_timestamp_ms: int,
        topic: str,
        keys: list[str],
        uniq_key: str | None,
        sys_flag: int,
    ) -> int:
        """Index one commitlog record; returns how many keys were put.

        Skips rollback records and records at or below :meth:`last_indexed_offset` (so
        re-dispatching a range is a no-op). ``keys`` is ``KEYS`` split on spaces; empty
        keys are skipped. ``uniq_key`` is indexed whenever it is not None, as RocketMQ does.
        """
        if record_phys_offset < 0:
            raise ValueError(f"record offset {record_phys_offset} is negative")
        if len(keys) > MAX_PROPERTIES_BYTES:  # KEYS comes from the bounded properties
            raise ValueError(f"{len(keys)} keys exceed what a record's properties can hold")
        if sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_ROLLBACK:
            with self._write_lock:
                self._check_usable()
                self._reap()
            return 0
        hashes = [index_key_hash(key) for key in _index_keys(topic, keys, uniq_key)]
        count = len(hashes)
        return self.build_keys([record_phys_offset] * count, [store_timestamp_ms] * count, hashes)

    def build_keys(
        self,
        phys_offsets: Sequence[int],
        store_timestamps_ms: Sequence[int],
        key_hashes: Sequence[int],
    ) -> int:
        """Index the keys of many records at once; returns how many keys were put.

        One entry per key, in commitlog order (``phys_offsets`` never goes back; a
        record's keys are consecutive: UNIQ_KEY first, then KEYS, as :meth:`build`
        orders them; the caller skips rollback records). ``key_hashes`` come from
        :func:`tide.format.index_key_hash` of the full ``topic#key``. Records at or below
        :meth:`last_indexed_offset` are skipped, as :meth:`build` skips them. The newest
        file's header is written once per file touched, not once per key.
        """
        with self._write_lock:
            self._check_usable()
            self._reap()
            total = len(key_hashes)
            if not total:
                return 0
            assert len(phys_offsets) == len(store_timestamps_ms) == total
            if phys_offsets[0] < 0:
                raise ValueError(f"record offset {phys_offsets[0]} is negative")
            skip = bisect_right(phys_offsets, self._last_indexed)
            done = skip
            # The files the batch will roll to, preallocated before any key is put: a
            # full disk fails the batch here, whole, rather than between two keys of a
            # record (a retry would skip the record's other keys).
            spares = self._reserve(total - skip)
            self._writes += 1  # odd: queries retry (see query)
            try:
                while done < total:
                    target = self._files[-1] if self._files else None
                    put = self._put_keys(
                        target, key_hashes, phys_offsets, store_timestamps_ms, done
                    )
                    if not put:
                        target = self._roll(target, spares[0] if spares else None)
                        del spares[:1]  # used (on failure, the finally removes it)
                        put = self._put_keys(
                            target, key_hashes, phys_offsets, store_timestamps_ms, done
                        )
                        if not put:
                            raise RuntimeError(f"fresh index file {target.mf.path} refused a key")
                    assert target is not None
                    target.dirty = True
                    done += put
                    self._last_indexed = phys_offsets[done - 1]
            finally:
                self._writes += 1
                for spare in spares:  # (not needed after all, or the batch failed)
                    spare.unlink(missing_ok=True)
            return done - skip

    def _reserve(self, keys: int) -> list[Path]:
        """Preallocated temporary files for what ``keys`` more keys need beyond the
        newest file's room."""
        newest = self._files[-1] if self._files else None
        room = self.geometry.max_entries - newest.header().index_count if newest else 0
        per_file = self.geometry.max_entries - 1  # a fresh file's first entry number is 1
        needed = max(0, -(-(keys - room) // per_file))
        spares: list[Path] = []
        try:
            for number in range(needed):
                spare = self.directory / f"{TMP_FILE_NAME}.{number}"
                allocate_file(spare, self.geometry.file_bytes)
                spares.append(spare)
        except BaseException:
            for spare in spares:
                spare.unlink(missing_ok=True)
            raise
        return spares

    def _put_keys(
        self,
        target: _IndexFile | None,
        key_hashes: Sequence[int],
        phys_offsets: Sequence[int],
        store_timestamps_ms: Sequence[int],
        start: int,
    ) -> int:
        if target is None:
            return 0
        if start:
            key_hashes = key_hashes[start:]
            phys_offsets = phys_offsets[start:]
            store_timestamps_ms = store_timestamps_ms[start:]
        mf = target.mf
        return put_key_batch(
            mf.mm, self.geometry, key_hashes, phys_offsets, store_timestamps_ms, fd=mf.fileno
        )

    def _roll(self, previous: _IndexFile | None, spare: Path | None = None) -> _IndexFile:
        """Create the next file (from ``spare``, preallocated, if given); its header
        continues from ``previous``'s end values."""
        if len(self._files) >= self._max_files:
            raise RuntimeError(
                f"{self.directory} already holds {len(self._files)} index files "
                f"(limit {self._max_files}); delete old ones first"
            )
        if previous is not None:
            header = previous.header()
            assert is_index_full(header, self.geometry), previous.name
            end_offset, end_timestamp = header.end_phy_offset, header.end_timestamp_ms
        else:
            end_offset, end_timestamp = 0, 0
        created = self._create(end_offset, end_timestamp, spare)
        with self._list_lock:
            self._files.append(created)
        log.info("new index file %s", created.mf.path)
        return created

    def _create(
        self, end_phy_offset: int, end_timestamp_ms: int, spare: Path | None = None
    ) -> _IndexFile:
        """Preallocate (or take ``spare``) and fill a tmp file, then link it under a name
        no file has. Nothing is left behind if that fails (a full disk)."""
        size = self.geometry.file_bytes
        tmp = spare
        if tmp is None:
            tmp = self.directory / TMP_FILE_NAME
            allocate_file(tmp, size)
        try:
            fd = os.open(tmp, os.O_RDWR)
            try:
                header = bytearray(INDEX_HEADER_BYTES)
                init_index_header(header, end_phy_offset, end_timestamp_ms)
                os.pwrite(fd, header, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            name = self._link_new_name(tmp)
        finally:
            tmp.unlink(missing_ok=True)
        try:
            fsync_dir(self.directory)
            return _IndexFile(name, MappedFile(self.directory / name, 0, size))
        except BaseException:
            (self.directory / name).unlink(missing_ok=True)
            raise

    def _link_new_name(self, tmp: Path) -> str:
        """Link ``tmp`` under the first free name after every known one (never overwrites).

        A name is taken from the clock; when it is not after the newest known name (same
        millisecond, clock going back) or exists, the creation time is bumped by 1 ms.
        """
        known = [f.name for f in self._files] + [f.name for f in self._pending]
        floor = max(known, default="")
        ms = self._clock_ms()
        for _ in range(_NAME_TRIES):
            name = index_file_name(ms)
            if name > floor:
                try:
                    os.link(tmp, self.directory / name)  # fails rather than replace
                    return name
                except FileExistsError:
                    floor = name
            # Next try: 1 ms after the floor name (whatever the clock says: it went back).
            floor_ms = parse_index_file_name(floor)
            assert floor_ms is not None, floor
            ms = floor_ms + 1
        raise RuntimeError(f"no free index file name in {self.directory} after {_NAME_TRIES}")

    # -- querying ------------------------------------------------------------------
    def query(self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int) -> list[int]:
        """Commitlog offsets of records indexed under ``topic#key`` stored in
        ``[begin_ms, end_ms]``, newest first, at most ``max_count``.

        Candidates only: different keys share hashes, so the caller reads each message and
        checks its real keys (and topic).
        """
        if not 1 <= max_count <= MAX_QUERY_COUNT:
            raise ValueError(f"max_count {max_count} must be in 1..{MAX_QUERY_COUNT}")
        if begin_ms > end_ms:
            raise ValueError(f"time range [{begin_ms}, {end_ms}] is empty")
        if not key or len(key) > MAX_QUERY_KEY_CHARS:
            raise ValueError(f"key must have 1..{MAX_QUERY_KEY_CHARS} characters")
        full_key = index_key(topic, key)
        writes = self._writes
        if not writes % 2:
            found = self._query(full_key, max_count, begin_ms, end_ms)
            if self._writes == writes:
                return found
        # A batch of puts ran meanwhile (its slots are written before its header): ask
        # again with the writer kept out; a batch takes milliseconds.
        with self._write_lock:
            return self._query(full_key, max_count, begin_ms, end_ms)

    def _query(self, full_key: str, max_count: int, begin_ms: int, end_ms: int) -> list[int]:
        found: list[int] = []
        for f in self._snapshot_newest_first():
            if not f.mf.hold():  # deleted since the snapshot
                continue
            try:
                # Read with f.mf.read: on a thread marked by read_through_file (the
                # dispatch's readers) with pread, the GIL free while the disk answers.
                header = read_index_header(f.mf.read(0, INDEX_HEADER_BYTES))
                if index_time_matched(header, begin_ms, end_ms):
                    found += select_phy_offsets(
                        f.mf.mm,
                        self.geometry,
                        full_key,
                        max_count - len(found),
                        begin_ms,
                        end_ms,
                        read=f.mf.read,
                    )
            finally:
                f.mf.release()
            if len(found) >= max_count or header.begin_timestamp_ms < begin_ms:
                break
        assert len(found) <= max_count, (len(found), max_count)
        return found

    def _snapshot_newest_first(self) -> list[_IndexFile]:
        with self._list_lock:
            return self._files[::-1]

    # -- deleting ------------------------------------------------------------------
    def truncate_past(self, commitlog_offset: int) -> int:
        """Forget what was indexed at or after ``commitlog_offset`` (the commitlog's tail was
        cut there): delete, newest first, every file whose ``end_phy_offset`` is at or past
        it. Whole files go, as RocketMQ deletes whole files in abnormal recovery.

        Returns :meth:`last_indexed_offset` afterwards (NO_OFFSET when nothing is left):
        every record after it must be dispatched again; records at or below it are skipped.
        """
        if commitlog_offset < 0:
            raise ValueError(f"commitlog offset {commitlog_offset} is negative")
        with self._write_lock:
            self._check_usable()
            with self._list_lock:
                doomed: list[_IndexFile] = []
                while self._files and self._files[-1].header().end_phy_offset >= commitlog_offset:
                    doomed.append(self._files.pop())
            self._retire(doomed)
            self._last_indexed = self._compute_last_indexed()
            assert self._last_indexed < commitlog_offset, (self._last_indexed, commitlog_offset)
            return self._last_indexed

    def delete_below(self, commitlog_min_offset: int) -> int:
        """Delete the oldest files whose ``end_phy_offset`` is below the commitlog's first
        offset (``IndexService.deleteExpiredFile``): oldest first, stopping at the first
        file still needed, never the newest. Returns how many were deleted."""
        with self._write_lock:
            self._check_usable()
            with self._list_lock:
                doomed: list[_IndexFile] = []
                while (
                    len(self._files) > 1
                    and self._files[0].header().end_phy_offset < commitlog_min_offset
                ):
                    doomed.append(self._files.pop(0))
            self._retire(doomed)
            self._last_indexed = self._compute_last_indexed()
            return len(doomed)

    def _retire(self, doomed: list[_IndexFile]) -> None:
        """Unlink now (durably), unmap once no reader holds the file."""
        if not doomed:
            return
        self._pending.extend(doomed)
        for f in doomed:
            log.info("deleting index file %s", f.mf.path)
            f.mf.path.unlink()
        fsync_dir(self.directory)
        self._reap()

    def _reap(self, force_after_ms: int = DESTROY_FORCE_AFTER_MS) -> None:
        self._pending = [f for f in self._pending if not f.mf.try_destroy(force_after_ms)]

    # -- flushing, status, closing -------------------------------------------------
    def flush(self) -> int:
        """fdatasync every file written since its last flush; returns how many were."""
        synced = 0
        for f in self._snapshot_newest_first():
            if not f.dirty or not f.mf.hold():
                continue
            try:
                f.dirty = False  # cleared first: a put during the sync marks it again
                try:
                    f.mf.sync()
                except BaseException:
                    f.dirty = True
                    raise
            finally:
                f.mf.release()
            synced += 1
        return synced

    def last_indexed_offset(self) -> int:
        """Commitlog offset of the last record indexed, NO_OFFSET when none."""
        return self._last_indexed

    def status(self) -> IndexStatus:
        files = self._snapshot_newest_first()
        entries = 0
        last_timestamp = 0
        for i, f in enumerate(files):
            if not f.mf.hold():
                continue
            try:
                header = f.header()
            finally:
                f.mf.release()
            entries += header.index_count - 1
            if i == 0:
                last_timestamp = header.end_timestamp_ms
        return IndexStatus(
            files=len(files),
            entries=entries,
            last_indexed_offset=self._last_indexed,
            last_timestamp_ms=last_timestamp,
            pending_destroys=len(self._pending),
        )

    def close(self) -> None:
        """Flush and unmap every file. Queries must have stopped."""
        with self._write_lock:
            if self._closed:
                return
            self.flush()
            with self._list_lock:
                files, self._files = self._files, []
            self._closed = True
            for f in files:
                f.mf.close()
            self._reap(force_after_ms=0)
            assert not self._pending

    # -- helpers -------------------------------------------------------------------
    def _check_usable(self, *, loading: bool = False) -> None:
        if self._closed:
            raise RuntimeError(f"index service of {self.directory} is closed")
        if loading and self._loaded:
            raise RuntimeError(f"index service of {self.directory} is already loaded")
        if not loading and not self._loaded:
            raise RuntimeError(f"index service of {self.directory} is not loaded")

    def _compute_last_indexed(self) -> int:
        """The newest file's end offset; a fresh file continued from a full one carries
        that file's end offset, a fresh first file carries nothing."""
        for f in self._snapshot_newest_first():
            header = f.header()
            if header.index_count > 1 or header.end_phy_offset > 0:
                return header.end_phy_offset
        return NO_OFFSET


def _index_keys(topic: str, keys: Iterable[str], uniq_key: str | None) -> list[str]:
    """The full keys of a record, in RocketMQ's order: UNIQ_KEY, then each KEYS key."""
    full = [index_key(topic, uniq_key)] if uniq_key is not None else []
    full.extend(index_key(topic, key) for key in keys if key)
    return full


def _check_order(files: list[_IndexFile]) -> None:
    """Files index ever later records: their end offsets never go back."""
    previous_end = 0
    for f in files:
        end = f.header().end_phy_offset
        if end < previous_end:
            raise ValueError(
                f"index file {f.mf.path} ends at offset {end}, before the previous file "
                f"({previous_end}): the index directory is corrupt"
            )
        previous_end = end

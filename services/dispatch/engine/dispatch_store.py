"""DispatchStore: consume queues + key index built from commitlog records, and progress.

RocketMQ's ReputMessageService / CommitLogDispatcher as a library. One writer thread
calls :meth:`DispatchStore.apply` with records in commitlog order (from a
``tide.tail.follower.TailFollower``); a flush thread makes the files durable and then records the
commitlog offset they cover in ``dispatch_progress.json``. So after a crash:

* every record below the recorded offset has its entries on disk;
* records after it may have entries or not: they are dispatched again, and both the
  consume queues (by queue offset) and the index (by physical offset) skip what they
  already hold, so re-dispatching never duplicates or reorders anything.

:meth:`DispatchStore.reconcile` aligns this with the storage at start (or after the
storage truncated its tail): entries past the storage's max offset are dropped, and the
Tail resumes from the recorded offset, or from the storage's min offset when the
directories are empty (a rebuild from the whole commitlog).
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import add
from pathlib import Path
from typing import NamedTuple, NoReturn

from services.dispatch.engine.batch_fields import (
    DispatchProperties,
    TagsCodes,
    properties_of_records,
    split_keys,
)
from services.dispatch.engine.consume_queue import ConsumeQueueConflictError, Entry
from services.dispatch.engine.consume_queue_store import (
    FLUSH_LEAST_PAGES,
    FLUSH_THOROUGH_INTERVAL_MS,
    ConsumeQueueStore,
)
from services.dispatch.engine.index_service import IndexService
from services.dispatch.engine.key_hashes import key_hashes
from tide.files import (
    FileLock,
    describe_space,
    fsync_dir,
    is_out_of_space,
    load_json_with_fallback,
    write_json_atomically,
)
from tide.format import (
    DEFAULT_DELAY_LEVEL_TABLE,
    DEFAULT_INDEX_MAX_ENTRIES,
    DEFAULT_INDEX_SLOT_COUNT,
    DELAY,
    ENTRY_BYTES,
    SCHEDULE_TOPIC,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_ROLLBACK,
    DelayLevelTable,
    IndexGeometry,
    IntColumn,
    decode_properties,
    is_queue_less,
    iter_entries,
    parse_delay_property,
    queue_entry_runs,
    schedule_tags_code,
)
from tide.limits import KEYS_MAX_COUNT
from tide.service_thread import PagePolicy, ServiceThread
from tide.tail import RecordAt, RecordBatch, gc_paused

log = logging.getLogger("tide.dispatch.store")
PROGRESS_FILE = "dispatch_progress.json"
LOCK_FILE = "dispatch.lock"
# At most this many keys of a record are indexed: produce and append refuse more
# (tide.limits), so only a record appended as raw bytes by another writer can have more.
MAX_KEYS_PER_RECORD = KEYS_MAX_COUNT


class RecordIdentity(NamedTuple):
    """Enough to tell a record from another written at the same offset later."""

    offset: int
    size: int
    store_timestamp_ms: int
    body_crc: int


class _KeyPrefixes(dict[str, bytes]):
    """Topic -> the UTF-8 bytes of ``topic#``, the start of its index keys."""

    def __missing__(self, topic: str) -> bytes:
        if len(self) >= 4096:
            self.clear()
        prefix = self[topic] = f"{topic}#".encode()
        return prefix


def _key_columns(keys: list[bytes], uniq_keys: list[bytes | None]) -> list[list[bytes]] | None:
    """The index keys of a batch (without the topic) as columns, when every record has
    the same ones: UNIQ_KEY if every record has one (``uniq_keys``), then KEYS if every
    record has exactly one key (no space); [] when no record has either; None for
    anything else (records with different numbers of keys)."""
    columns: list[list[bytes]] = []
    # all() first: a truth test a key, where count(None) compares each bytes with None
    # (~20 ns a record against ~6); every key present is the common case.
    missing = 0 if all(uniq_keys) else uniq_keys.count(None)
    if missing == 0:
        columns.append(uniq_keys)  # type: ignore[arg-type]  # no None in it
    elif missing != len(uniq_keys):
        return None
    if all(keys):
        if b" " in b"\x02".join(keys):
            return None
        columns.append(keys)
    elif keys.count(keys[0]) != len(keys) and any(keys):  # (keys all alike: all empty)
        return None
    return columns


def _each_twice(column: IntColumn) -> IntColumn:
    """``[a, a, b, b, ...]`` of ``column``'s values, of its kind (array('q') or list)."""
    twice = column * 2
    if isinstance(twice, array):
        assert isinstance(column, array)
        twice[0::2] = twice[1::2] = column
    else:
        twice[0::2] = twice[1::2] = column
    return twice


def _holds(topics: list[str], topic: str) -> bool:
    """``topic in topics``, answered from the first when they are all one topic (the
    usual batch): a count (identity first: a stream's topics are one object) is ~10x
    cheaper than ``in``, which compares every other topic with ``topic``."""
    if topics and topics.count(topics[0]) == len(topics):
        return topics[0] == topic
    return topic in topics


class DispatchDiskFullError(Exception):
    """The store's disk is full (ENOSPC): the batch was not wholly applied. Nothing
    half-written is served (a queue's entries are published after they are written, a
    file is created whole or not at all) and applying the batch again once there is room
    completes it (puts are idempotent). ``arrivals``: the queues it grew meanwhile."""

    def __init__(self, message: str, arrivals: list[Arrival]) -> None:
        super().__init__(message)
        self.arrivals = arrivals


class DispatchDivergedError(Exception):
    """Our entries disagreed with the commitlog at ``offset``; they were dropped from
    there. Reconcile with the storage and follow again."""

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(f"entries diverged from the commitlog at {offset}: {why}")
        self.offset = offset


@dataclass(frozen=True)
class DispatchConfig:
    store_dir: Path
    entries_per_segment: int = 300_000
    index_slot_count: int = DEFAULT_INDEX_SLOT_COUNT
    index_max_entries: int = DEFAULT_INDEX_MAX_ENTRIES
    flush_interval_ms: int = 1_000
    # --message-delay-level: a SCHEDULE_TOPIC_XXXX entry's tags code is its delivery time.
    delay_levels: DelayLevelTable = DEFAULT_DELAY_LEVEL_TABLE


@dataclass(frozen=True, slots=True)
class Arrival:
    """A queue grew: its next offset to write is now ``max_offset``."""

    topic: str
    queue_id: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class DispatchStatus:
    dispatched_offset: int
    durable_offset: int
    queues: int
    cq_segments: int
    index_files: int
    index_entries: int
    disk_full: str = ""  # why dispatch cannot write (empty: it can)


class DispatchStore:
    def __init__(self, config: DispatchConfig) -> None:
        self.config = config
        root = config.store_dir
        self._lock = FileLock(root / LOCK_FILE, f"dispatch store {root}")
        self.consume_queues = ConsumeQueueStore(root, config.entries_per_segment)
        geometry = IndexGeometry(config.index_slot_count, config.index_max_entries)
        self.index = IndexService(root, geometry)
        self._dispatched = 0  # end of the last applied record (writer thread only)
        self._durable = 0  # what the progress file says
        # Identity of the last applied record, and of the one the progress file names:
        # (offset, size, store timestamp, body CRC); checked against the storage at start.
        self._last_record: RecordIdentity | None = None
        self.durable_record: RecordIdentity | None = None
        # Held while progress is captured and written (flush thread) or lowered
        # (reconcile, drop_from), so a flush cannot write an offset a cut invalidated.
        self._progress_lock = threading.Lock()
        self._flusher: _FlushThread | None = None
        self._opened = False
        self._tags_codes = TagsCodes()
        self._key_prefixes = _KeyPrefixes()
        # A full disk met by apply (the writer) or flush (the flush thread); None: not.
        self.apply_blocked: str | None = None
        self.flush_blocked: str | None = None

    @property
    def disk_full(self) -> str | None:
        """Why the store cannot write now (a full disk), or None."""
        return self.apply_blocked or self.flush_blocked

    def out_of_space(self, exc: OSError, doing: str) -> str:
        """The message for ENOSPC while ``doing``, naming the store and its free space."""
        root = self.config.store_dir
        return (
            f"no space left on the disk of dispatch store {root} while {doing} "
            f"({describe_space(root)}): {exc.strerror or exc}; dispatch holds at commitlog "
            f"offset {self._dispatched} and resumes once space is freed"
        )

    # -- lifecycle ---------------------------------------------------------------
    def open(self) -> None:
        self.config.store_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            self.consume_queues.load()
            self.consume_queues.recover()
            self.index.load()
            self._durable = self._read_progress()
        except BaseException:
            self._lock.release()
            raise
        self._dispatched = self._durable
        self._flusher = _FlushThread(self, self.config.flush_interval_ms)
        self._flusher.start()
        self._opened = True

    def close(self) -> None:
        if not self._opened:
            return
        self._opened = False
        assert self._flusher is not None
        self._flusher.stop()
        try:
            self.flush(thorough=True)
        except OSError as exc:
            if not is_out_of_space(exc):
                raise
            # The progress file keeps an older offset: the next start dispatches the
            # records after it again, which skips what the files already hold.
            log.error("closing without recording progress: %s", self.out_of_space(exc, "closing"))
        self.consume_queues.close()
        self.index.close()
        self._lock.release()

    # -- progress ----------------------------------------------------------------
    @property
    def dispatched_offset(self) -> int:
        """The commitlog offset up to which every record has been applied."""
        return self._dispatched

    def _read_progress(self) -> int:
        obj, _ = load_json_with_fallback(self.config.store_dir / PROGRESS_FILE)
        if obj is None:
            return 0
        offset = obj.get("dispatchedOffset") if isinstance(obj, dict) else None
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"{PROGRESS_FILE}: dispatchedOffset must be an integer >= 0")
        last = obj.get("lastRecord")
        if isinstance(last, dict):
            try:
                self.durable_record = RecordIdentity(**{k: int(v) for k, v in last.items()})
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{PROGRESS_FILE}: lastRecord is malformed: {exc}") from None
        return offset

    def flush(self, *, thorough: bool) -> None:
        """Flush consume queues and index, then record the offset they now cover."""
        with self._progress_lock:
            covered = self._dispatched  # captured before the flush: the flush covers it
            record = self._last_record
            self.consume_queues.flush(0 if thorough else FLUSH_LEAST_PAGES)
            self.index.flush()
            if covered != self._durable:
                self._write_progress(covered, record)

    def _write_progress(self, offset: int, record: RecordIdentity | None) -> None:
        """Record durably that everything below ``offset`` is dispatched; ``record`` is
        the last record applied below it (None when unknown)."""
        if record is not None and record.offset + record.size != offset:
            record = None
        obj: dict[str, object] = {
            "dispatchedOffset": offset,
            "updatedMs": time.time_ns() // 1_000_000,
        }
        if record is not None:
            obj["lastRecord"] = record._asdict()
        write_json_atomically(self.config.store_dir / PROGRESS_FILE, obj)
        self._durable = offset
        self.durable_record = record

    def _lower_progress(self, offset: int) -> None:
        """Record durably that dispatch must redo from ``offset``. On a full disk the
        progress file (and its backup) is removed instead: a restart then dispatches from
        the storage's min offset, which skips what the files hold, rather than trusting
        an offset past entries that were dropped; and a start does not fail on it."""
        try:
            self._write_progress(offset, None)
        except OSError as exc:
            if not is_out_of_space(exc):
                raise
            path = self.config.store_dir / PROGRESS_FILE
            for stale in (path, path.with_name(PROGRESS_FILE + ".bak")):
                stale.unlink(missing_ok=True)
            fsync_dir(self.config.store_dir)
            self._durable, self.durable_record = 0, None
            why = self.out_of_space(exc, "lowering the progress")
            log.error("%s; removed the progress file instead", why)

    # -- reconciling with the storage --------------------------------------------
    def reconcile(self, storage_min: int, storage_max: int) -> int:
        """Drop what lies past the storage's end; return where the Tail must resume."""
        assert 0 <= storage_min <= storage_max, (storage_min, storage_max)
        with self._progress_lock:
            return self._reconcile_locked(storage_min, storage_max)

    def _reconcile_locked(self, storage_min: int, storage_max: int) -> int:
        dropped, redo_from = self._truncate_past(storage_max)
        if dropped:
            log.warning(
                "dropped %d consume queue entries past the storage's max offset %d",
                dropped,
                storage_max,
            )
        resume = min(self._durable, storage_max, redo_from)
        if resume < storage_min:
            log.info(
                "rebuilding from the storage's min offset %d (dispatched up to %d)",
                storage_min,
                resume,
            )
            resume = storage_min
        self._dispatched = resume
        if resume < self._durable:  # durably, before anything else can run
            self._lower_progress(resume)
        return resume

    def _truncate_past(self, offset: int) -> tuple[int, int]:
        """Drop consume queue entries and index files at or past ``offset``. Returns the
        entries dropped and the offset dispatch must redo from: ``offset``, or lower when
        whole index files went (their records below the cut are indexed again from the
        last one still indexed, a record boundary, or from the start)."""
        dropped = self.consume_queues.truncate_past(offset)
        indexed_before = self.index.last_indexed_offset()
        indexed_after = self.index.truncate_past(offset)
        redo_from = offset
        if indexed_after != indexed_before:
            redo_from = min(offset, max(indexed_after, 0))
        return dropped, redo_from

    def cleanup(self, storage_min: int) -> None:
        """Delete consume queue segments and index files only pointing below the min."""
        self.consume_queues.delete_below(storage_min)
        self.index.delete_below(storage_min)

    # -- the writer ----------------------------------------------------------------
    def apply(self, records: Sequence[RecordAt] | RecordBatch) -> list[Arrival]:
        """Dispatch records (in commitlog order, resumed at ``dispatched_offset``).

        A batch at a time: each queue's entries are written as one run, the index keys
        of the batch are hashed together and put with one header write; the result is
        that of dispatching the records one by one, in order (which is what happens
        when a queue entry conflicts, so that everything before it is dispatched).
        """
        batch = records if isinstance(records, RecordBatch) else RecordBatch.from_records(records)
        if not batch:
            return []
        self._check_resume(batch)
        arrivals: list[Arrival] = []
        try:
            with gc_paused():
                props = properties_of_records(
                    batch.data, batch.props_starts, batch.positions, batch.sizes
                )
                try:
                    self._put_entries(batch, props, arrivals)
                except ConsumeQueueConflictError:
                    return self._apply_one_by_one(batch, props)
                self._index(batch, props)
        except OSError as exc:
            if not is_out_of_space(exc):
                raise
            doing = f"writing {exc.filename}" if exc.filename else "dispatching"
            self.apply_blocked = self.out_of_space(exc, doing)
            raise DispatchDiskFullError(self.apply_blocked, arrivals) from exc
        self.apply_blocked = None
        self._advance(batch, len(batch) - 1)
        return arrivals

    def _check_resume(self, batch: RecordBatch) -> None:
        """Per batch: the first record does not straddle the dispatched offset (a later
        one may, when the commitlog was rewritten: its queue entry conflicts first)."""
        first, size = batch.offsets[0], batch.sizes[0]
        assert first >= self._dispatched or first + size <= self._dispatched, (
            first,
            self._dispatched,
        )

    def _advance(self, batch: RecordBatch, last: int) -> None:
        end = batch.offsets[last] + batch.sizes[last]
        if end > self._dispatched:
            self._dispatched = end
            self._last_record = RecordIdentity(
                batch.offsets[last],
                batch.sizes[last],
                batch.store_timestamps[last],
                batch.body_crc(last),
            )

    def _put_entries(
        self, batch: RecordBatch, props: DispatchProperties, arrivals: list[Arrival]
    ) -> None:
        """Each queue's entries: a run of consecutive queue offsets (the usual case) in
        one ``put_run``, anything else one ``put`` at a time. An arrival per queue that
        grew, with the offset after the last entry written, as one put each would say,
        added to ``arrivals`` as each queue is done. The records are grouped by queue,
        and each queue's entries packed, in one call (``tide.format.queue_entry_runs``)."""
        tags = props.tags
        if tags.count(tags[0]) == len(tags):  # one tag (or none) in the whole batch
            codes = [self._tags_codes[tags[0]]] * len(tags)
        else:
            codes = list(map(self._tags_codes.__getitem__, tags))
        if _holds(batch.topics, SCHEDULE_TOPIC):  # rare: delay-level messages
            codes = [
                self._schedule_code(batch, index, code) if topic == SCHEDULE_TOPIC else code
                for index, (topic, code) in enumerate(zip(batch.topics, codes, strict=True))
            ]
        runs = queue_entry_runs(
            batch.topics,
            batch.queue_ids,
            batch.sys_flags,
            batch.queue_offsets,
            batch.offsets,
            batch.sizes,
            codes,
        )
        for topic, queue_id, queue_offsets, entries in runs:
            queue = self.consume_queues.get_or_create(topic, queue_id)
            top: int | None = None  # after the last entry written
            if isinstance(queue_offsets, int):  # consecutive: one run
                if queue.put_entries_run(queue_offsets, entries):
                    top = queue_offsets + len(entries) // ENTRY_BYTES
            else:
                for queue_offset, entry in zip(queue_offsets, iter_entries(entries), strict=True):
                    if queue.put(queue_offset, *entry):
                        top = queue_offset + 1
            if top is not None:
                arrivals.append(Arrival(topic, queue_id, top))

    def _schedule_code(self, batch: RecordBatch, index: int, code: int) -> int:
        """The tags code of a SCHEDULE_TOPIC_XXXX record: its delivery time, store time +
        its level's delay (``CommitLog.checkMessageAndReturnSize``: a level above the
        table is the last; without a positive ``DELAY`` the ordinary ``code``)."""
        delay = decode_properties(batch.properties_bytes(index)).get(DELAY)
        level = None if delay is None else parse_delay_property(delay)
        if level is None or level <= 0:
            return code
        return schedule_tags_code(self.config.delay_levels, level, batch.store_timestamps[index])

    def _index(self, batch: RecordBatch, props: DispatchProperties) -> None:
        """Put the keys of the batch's records (UNIQ_KEY first, then KEYS, as
        IndexService.build orders them) with one hash pass and one build_keys call."""
        offsets, stamps, topics = batch.offsets, batch.store_timestamps, batch.topics
        keys, uniq_keys = props.keys, props.uniq_keys
        flags = batch.sys_flags
        # One flag for the whole batch is the usual case: a count (identity first: small
        # ints are shared) is ~10x cheaper than the set of them.
        if flags.count(flags[0]) == len(flags):
            rollback = flags[0] & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_ROLLBACK
        else:
            rollback = any(
                f & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_ROLLBACK for f in set(flags)
            )
        columns = None if rollback else _key_columns(keys, uniq_keys)
        if columns is not None:
            # The common cases: every record has the same number of keys (0, 1 or 2:
            # UNIQ_KEY and one KEYS key), often all of one topic.
            self._index_columns(batch, columns)
            return
        prefixes = list(map(self._key_prefixes.__getitem__, topics))
        full: list[bytes] = []
        phys: list[int] = []
        times: list[int] = []
        for index, (prefix, value, uniq) in enumerate(zip(prefixes, keys, uniq_keys, strict=True)):
            if rollback and (
                flags[index] & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_ROLLBACK
            ):
                continue
            record_keys = [prefix + uniq] if uniq is not None else []
            if value:
                record_keys += [prefix + key for key in split_keys(value, MAX_KEYS_PER_RECORD)]
            full += record_keys
            phys += repeat(offsets[index], len(record_keys))
            times += repeat(stamps[index], len(record_keys))
        self.index.build_keys(phys, times, key_hashes(full))

    def _index_columns(self, batch: RecordBatch, columns: list[list[bytes]]) -> None:
        """Put ``columns`` (see :func:`_key_columns`): a key of each column per record."""
        offsets, stamps, topics = batch.offsets, batch.store_timestamps, batch.topics
        values: list[bytes]
        if len(columns) == 2:  # interleaved: UNIQ_KEY then KEYS of each record
            values = columns[0] + columns[1]
            values[0::2], values[1::2] = columns
            phys, times = _each_twice(offsets), _each_twice(stamps)
        elif columns:
            values, phys, times = columns[0], offsets, stamps
        else:
            values, phys, times = [], offsets[:0], stamps[:0]
        hashes: IntColumn = []
        if not values:
            pass
        elif topics.count(topics[0]) == len(topics):
            hashes = key_hashes(values, self._key_prefixes[topics[0]])
        else:
            prefixes: Iterable[bytes] = map(self._key_prefixes.__getitem__, topics)
            if len(columns) == 2:
                prefixes = [prefix for prefix in prefixes for _ in range(2)]
            hashes = key_hashes(list(map(add, prefixes, values)))
        self.index.build_keys(phys, times, hashes)

    def _apply_one_by_one(self, batch: RecordBatch, props: DispatchProperties) -> list[Arrival]:
        """The records one at a time (a queue entry conflicts: dispatch everything
        before it, then drop from it, see :meth:`_diverged`)."""
        grown: dict[tuple[str, int], int] = {}
        for index, offset in enumerate(batch.offsets):
            assert offset >= self._dispatched or offset + batch.sizes[index] <= self._dispatched, (
                offset,
                self._dispatched,
            )
            topic = batch.topics[index]
            queue_id, queue_offset = batch.queue_ids[index], batch.queue_offsets[index]
            sys_flag, stamp = batch.sys_flags[index], batch.store_timestamps[index]
            if not is_queue_less(sys_flag):
                queue = self.consume_queues.get_or_create(topic, queue_id)
                code = self._tags_codes[props.tags[index]]
                if topic == SCHEDULE_TOPIC:
                    code = self._schedule_code(batch, index, code)
                try:
                    written = queue.put(queue_offset, offset, batch.sizes[index], code)
                except ConsumeQueueConflictError as exc:
                    self._diverged(offset, str(exc))
                if written:
                    grown[(topic, queue_id)] = queue_offset + 1
            uniq = props.uniq_keys[index]
            self.index.build(
                offset,
                stamp,
                topic,
                [
                    k.decode("utf-8", "replace")
                    for k in split_keys(props.keys[index], MAX_KEYS_PER_RECORD)
                ],
                None if uniq is None else uniq.decode("utf-8", "replace"),
                sys_flag,
            )
            self._advance(batch, index)
        return [Arrival(topic, queue_id, top) for (topic, queue_id), top in grown.items()]

    def last_dispatched_entry(self) -> tuple[str, int, Entry] | None:
        """(topic, queue id, entry) of the consume queue entry furthest in the commitlog."""
        best: tuple[str, int, Entry] | None = None
        for queue in self.consume_queues.queues():
            entry = queue.last_entry()
            if entry is not None and (
                best is None or entry.commitlog_offset > best[2].commitlog_offset
            ):
                best = (queue.topic, queue.queue_id, entry)
        return best

    def drop_from(self, offset: int, why: str) -> None:
        """The commitlog at ``offset`` is not what our entries say: the storage truncated
        its tail and appended anew while we were away. The commitlog is the truth: drop
        every entry from ``offset`` and the progress past it (durably)."""
        log.warning(
            "the commitlog changed under dispatch at %d (%s): dropping entries from there",
            offset,
            why,
        )
        with self._progress_lock:
            _, redo_from = self._truncate_past(offset)
            self._dispatched = min(self._dispatched, redo_from)
            if self._last_record is not None and self._last_record.offset >= redo_from:
                self._last_record = None
            if self._durable > redo_from:
                self._lower_progress(redo_from)

    def _diverged(self, offset: int, why: str) -> NoReturn:
        """Drop from ``offset`` (see :meth:`drop_from`), then raise so the caller
        reconciles and follows again."""
        self.drop_from(offset, why)
        raise DispatchDivergedError(offset, why)

    def status(self) -> DispatchStatus:
        counts = self.consume_queues.counts()
        index = self.index.status()
        return DispatchStatus(
            dispatched_offset=self._dispatched,
            durable_offset=self._durable,
            queues=counts.queues,
            cq_segments=counts.segments,
            index_files=index.files,
            index_entries=index.entries,
            disk_full=self.disk_full or "",
        )


class _FlushThread(ServiceThread):
    """Flushes every ``interval_ms`` (at least 2 dirty pages; everything every 60 s)."""

    name = "dispatch.flush"

    def __init__(self, store: DispatchStore, interval_ms: int) -> None:
        super().__init__(interval_ms / 1000)
        self._store = store
        self._pages = PagePolicy(FLUSH_LEAST_PAGES, FLUSH_THOROUGH_INTERVAL_MS)

    def run_once(self) -> None:
        """A full disk (the progress file cannot be written) is the store's disk-full
        state, logged once, not a failure with a traceback every second; the next round
        retries."""
        store = self._store
        try:
            store.flush(thorough=self._pages.thorough_due())
        except OSError as exc:
            if not is_out_of_space(exc):
                raise
            if store.flush_blocked is None:
                self.log.warning("%s", store.out_of_space(exc, f"writing {exc.filename}"))
            store.flush_blocked = store.out_of_space(exc, f"writing {exc.filename}")
            return
        if store.flush_blocked is not None:
            self.log.warning("dispatch store %s: flushing again", store.config.store_dir)
            store.flush_blocked = None

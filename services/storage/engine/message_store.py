"""MessageStore: opens a store directory and wires the engine's parts together.

Open: take the lock file, read the checkpoint and config, map the segments, recover
(normal or abnormal by the abort file), truncate the torn tail, start the background
threads (allocator, flush or group commit, commit with the write buffer pool,
checkpoint, retention), then create the abort file. Close reverses it: refuse appends,
stop the threads (each finishes with a last flush), write the checkpoint and snapshot,
unmap, remove the abort file, release the lock; the next open takes the normal path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace

from services.storage.engine import system_topics
from services.storage.engine.allocator import SegmentAllocator
from services.storage.engine.auth_table import AuthTable
from services.storage.engine.auth_table import installers as auth_installers
from services.storage.engine.checkpoint import StoreCheckpoint
from services.storage.engine.checkpoint_service import CheckpointService
from services.storage.engine.commitlog import AppendBatch, CommitLog
from services.storage.engine.config import FlushMode, StoreConfig
from services.storage.engine.consumer_offsets import CONSUMER_OFFSETS_FILE, ConsumerOffsets
from services.storage.engine.disk_guard import DiskGuard
from services.storage.engine.errors import (
    DiskFullError,
    InvalidMessageError,
    NotWritableError,
    TopicNotFoundError,
)
from services.storage.engine.flush_async import AsyncFlushService
from services.storage.engine.flush_sync import GroupCommitService
from services.storage.engine.group_table import SUBSCRIPTION_GROUP_FILE, GroupTable
from services.storage.engine.ha_ack_waiter import ReplicaOutcome, SlaveAckWaiter
from services.storage.engine.message_codec import MessageCodec, MessageLike
from services.storage.engine.metadata_files import MetadataFiles
from services.storage.engine.producer_runs import (
    ProducerBatch,
    check_batches,
    place_batches,
    record_batches,
)
from services.storage.engine.producer_state import (
    ProducerStateTable,
    batch_of,
    check_producer_properties,
    check_single_queue,
    entry_of,
)
from services.storage.engine.producer_state_service import (
    ProducerStateService,
    rebuild_producer_state,
)
from services.storage.engine.queue_offsets import QueueOffsetTable
from services.storage.engine.record_run import RecordRun, run_from_records
from services.storage.engine.recovery import RecoveryReport, recover
from services.storage.engine.retention import RetentionService
from services.storage.engine.run_check import RunChecker, Topics
from services.storage.engine.segment_queue import SegmentQueue
from services.storage.engine.store_files import (
    StoreLock,
    create_abort_file,
    remove_abort_file,
)
from services.storage.engine.system_topics import ensure_system_topics, grow_schedule_topic
from services.storage.engine.topic_table import TOPICS_FILE, TopicChange, TopicTable
from services.storage.engine.write_buffer_pool import CommitService, WriteBufferPool
from tide.files import DiskSpace, fsync_dir, is_out_of_space
from tide.format import (
    PRODUCER_STATE_FILE,
    SCHEDULE_TOPIC,
    SNAPSHOT_FILE,
    EncodedRecord,
    Snapshot,
    abort_file_exists,
    msg_id_prefix,
    pack_host,
    parse_host,
    read_snapshot,
    write_snapshot,
)
from tide.limits import RECORD_MAX_BYTES
from tide.quoting import quote
from tide.service_thread import ServiceThread

log = logging.getLogger("tide.storage.store")
PERM_WRITE = 2


@dataclass(frozen=True, slots=True)
class PutResult:
    batch: AppendBatch
    # Completes when the batch is durable (SYNC_FLUSH); None when nothing is awaited.
    durable: Future[None] | None
    # Completes when a slave acknowledged the batch (SYNC_MASTER); None otherwise.
    replicated: Future[ReplicaOutcome] | None = None
    # An idempotent producer's retry: ``batch`` is the stored original, nothing written.
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class StoreStatus:
    min_offset: int
    max_offset: int
    committed_offset: int
    flushed_offset: int
    segment_count: int
    disk_usage_ratio: float
    writable: bool
    topic_count: int


class MessageStore:
    def __init__(
        self,
        config: StoreConfig,
        *,
        clock_ms: Callable[[], int] | None = None,
        usage_ratio: Callable[[], float] | None = None,
        clock_s: Callable[[], float] | None = None,
        disk_space: Callable[[], DiskSpace] | None = None,
    ) -> None:
        """``usage_ratio`` (tests) stands in for the projected disk usage ratio,
        ``disk_space`` (tests) for the filesystem's numbers (see DiskGuard)."""
        self.config = config
        self._clock_ms = clock_ms
        self._usage_ratio = usage_ratio
        self._disk_space = disk_space
        self._clock_s = clock_s
        self._lock = StoreLock(config.store_dir)
        store_host = parse_host(config.store_host)
        self.codec = MessageCodec(store_host, config.max_message_body_bytes)
        self._store_host = pack_host(store_host)
        # put_run's topic lookups (UTF-8 name -> name, write queue count) for topics
        # that exist: a run's topics are looked up once per topic, and the same few
        # topics come in every run. Emptied on every change of the topic table (its
        # listener), so a deleted, read-only or resized topic is looked up again; at
        # most one entry a topic of the table. Replaced, not cleared: a check under way
        # when the table changes (from another thread) fills the dropped one.
        self._run_topics: Topics = {}
        self.run_checker = RunChecker(
            self._store_host,
            config.max_message_body_bytes,
            config.max_batch_messages,
            self._topic_name,
        )
        self.msg_id_prefix = msg_id_prefix(store_host)
        self._threads: list[ServiceThread] = []
        self._opened = False
        # Why put() refuses (None: it does not): not open, or a slave.
        self._put_refusal: str | None = "the store is not open"
        self._slave = False  # refuse_puts: its producer state is its master's copy
        # SYNC_MASTER: appends also wait for a slave's ack (set by the replication role).
        self.ha_waiter: SlaveAckWaiter | None = None
        self.recovery: RecoveryReport | None = None
        self.recovery_truncated_bytes = 0

    # -- lifecycle ---------------------------------------------------------------
    def open(self) -> None:
        cfg = self.config
        cfg.store_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            self._open_locked()
        except BaseException:
            self._lock.release()
            raise
        self._opened = True
        self._put_refusal = None

    def _open_locked(self) -> None:
        cfg = self.config
        abnormal = abort_file_exists(cfg.store_dir)
        self.checkpoint = StoreCheckpoint(cfg.store_dir)
        self.topics = TopicTable(cfg.config_dir)
        self.topics.add_listener(self._topics_changed)
        self.groups = GroupTable(cfg.config_dir)
        ensure_system_topics(self.topics)
        self.consumer_offsets = ConsumerOffsets(
            cfg.config_dir, persist_interval_ms=cfg.consumer_offsets_persist_interval_ms
        )
        # What a slave gets from its master (GetMetadata) and how it installs it.
        self.metadata = MetadataFiles(
            cfg.config_dir, before_read=self.consumer_offsets.persist_if_dirty
        )
        self.metadata.register(TOPICS_FILE, self.topics)
        self.metadata.register(CONSUMER_OFFSETS_FILE, self.consumer_offsets)
        self.metadata.register(SUBSCRIPTION_GROUP_FILE, self.groups)
        # Users and ACL policies (issue 22): replicated with the rest of config/.
        self.auth = AuthTable(cfg.config_dir)
        self.auth.load()
        for name, installer in auth_installers(self.auth).items():
            self.metadata.register(name, installer)
        self.allocator = SegmentAllocator(
            cfg.commitlog_dir,
            cfg.segment_size_bytes,
            preallocate=cfg.preallocate_enabled,
            warm=cfg.warm_segments_enabled,
            timeout_ms=cfg.allocation_timeout_ms,
        )
        self.segments = SegmentQueue(cfg.commitlog_dir, cfg.segment_size_bytes, self.allocator)
        self.segments.load()
        self.guard = DiskGuard(
            cfg.store_dir,
            cfg.commitlog_dir,
            cfg.disk_refuse_writes_ratio,
            self._next_segment_bytes,
            usage_ratio=self._usage_ratio,
            space=self._disk_space,
        )
        offsets = QueueOffsetTable()
        self.recovery = recover(
            self.segments.segments,
            abnormal=abnormal,
            checkpoint=self.checkpoint.value,
            snapshot=read_snapshot(cfg.store_dir),
            table=offsets,
        )
        self.recovery_truncated_bytes = self.segments.truncate(self.recovery.end_offset)
        self._settle_recovered(offsets)
        self.producers = ProducerStateTable(
            cfg.config_dir,
            window_batches=cfg.producer_window_batches,
            expiry_ms=cfg.producer_id_expiry_ms,
            max_producers=cfg.max_idempotent_producers,
        )
        # The offset the window's rebuild read the commitlog from (a snapshot's, or the
        # expiry's floor: producer_state_service.replay_floor).
        # Idempotent batches answered with their original result (tide_storage_...).
        self.idempotent_duplicates = 0
        self.producer_replay_from = rebuild_producer_state(
            self.producers, cfg.commitlog_dir, self.segments.max_offset, self._now_ms
        )
        self.metadata.register(PRODUCER_STATE_FILE, self.producers)
        self.pool = (
            WriteBufferPool(cfg.write_buffer_pool_buffers, cfg.segment_size_bytes)
            if cfg.write_buffer_pool_enabled
            else None
        )
        self.commitlog = CommitLog(
            self.segments,
            offsets,
            self._store_host,
            clock_ms=self._clock_ms,
            attach_write_buffer=self.pool.attach if self.pool else None,
            # Not this store's own body limit: it may hold records taken under another
            # setting, and a slave what its master took.
            max_record_bytes=RECORD_MAX_BYTES,
            guard=self.guard,
        )
        self._start_threads()
        self._prepare_segments()
        create_abort_file(cfg.store_dir)
        log.info(
            "store %s open: offsets [%d, %d), %d segment(s), %d topic(s)",
            cfg.store_dir,
            self.segments.min_offset,
            self.segments.max_offset,
            len(self.segments.segments),
            len(self.topics.list()),
        )

    def _settle_recovered(self, offsets: QueueOffsetTable) -> None:
        """Make the recovered state the durable base before any append: sync the
        segments recovery looked at and write a snapshot at the recovered end. Otherwise
        an older snapshot (past a cut, or with a stale flushed offset) could be trusted
        after the next crash."""
        report = self.recovery
        assert report is not None
        for segment in self.segments.segments:
            if segment.end_offset > report.start_offset:
                segment.sync()
        end = self.segments.max_offset
        assert end == report.end_offset or not self.segments.segments, (end, report)
        try:
            write_snapshot(self.config.store_dir, Snapshot(end, end, dict(offsets.next_offsets)))
        except OSError as exc:
            if not is_out_of_space(exc):
                raise
            self._drop_snapshot(exc)

    def _drop_snapshot(self, exc: OSError) -> None:
        """No room for the snapshot at open (a full disk): open anyway, rather than fail
        every restart, without any snapshot (the next recovery scans; none can be stale),
        appends refused until space is freed. The checkpoint service writes a new one."""
        store_dir = self.config.store_dir
        for path in (store_dir / SNAPSHOT_FILE, store_dir / (SNAPSHOT_FILE + ".bak")):
            path.unlink(missing_ok=True)
        fsync_dir(store_dir)
        error = self.guard.out_of_space(exc, "writing the queue offset snapshot at open")
        log.error("%s; opening without a snapshot", error)

    def _prepare_segments(self) -> None:
        """Have the segment being written and the next one ready before the first append:
        creating (and warming) one on the append path would stall it."""
        last = self.segments.last()
        if last is None or last.is_full:
            try:
                with self.commitlog.lock:
                    self.commitlog.writable_segment()  # creates it and schedules the next
            except DiskFullError as exc:  # open anyway: reads are served, appends refused
                log.error("opening without room for a segment: %s", exc)
        else:
            self.allocator.prepare(last.end_offset)

    def _next_segment_bytes(self) -> int:
        """What the segment after the one being written still needs on disk: nothing once
        it exists (created for a batch, or ahead of need) or is being created (counting
        it then as well as the blocks it already took would delete or refuse early),
        else a whole segment."""
        segments = self.segments
        current = segments.find(segments.max_offset)
        last = segments.last()
        if current is not None and last is not current:
            return 0
        next_start = last.end_offset if last is not None else 0
        return 0 if self.allocator.is_prepared(next_start) else segments.size_bytes

    def _prepare_next(self) -> None:
        """Ask for the segment after the last one when it is neither there nor being
        created (its creation ahead of need failed: a full disk), so that the roll finds
        it ready once there is room (retention calls this after every pass)."""
        with self.commitlog.lock:  # a roll creates it under the lock too: never twice
            last = self.segments.last()
            if last is not None and self.segments.find(last.end_offset) is None:
                self.allocator.prepare(last.end_offset)

    def _last_store_timestamp_ms(self) -> int:
        return self.commitlog.last_store_timestamp_ms

    def _make_flusher(self) -> ServiceThread:
        """Group commit (SYNC_FLUSH) or the interval flush thread (ASYNC_FLUSH)."""
        cfg = self.config
        on_flushed = self.checkpoint.set_physic_timestamp
        self.group_commit: GroupCommitService | None = None
        if cfg.flush_mode is FlushMode.SYNC:
            self.group_commit = GroupCommitService(
                self.segments,
                commit_first=self.pool is not None,
                last_store_timestamp_ms=self._last_store_timestamp_ms,
                on_flushed=on_flushed,
            )
            return self.group_commit
        return AsyncFlushService(
            self.segments,
            interval_ms=cfg.flush_interval_ms,
            least_pages=cfg.flush_least_pages,
            thorough_interval_ms=cfg.flush_thorough_interval_ms,
            last_store_timestamp_ms=self._last_store_timestamp_ms,
            on_flushed=on_flushed,
        )

    def _start_threads(self) -> None:
        """Start the background threads; ``self._threads`` is in stop order: committer,
        flusher, checkpoint, retention."""
        cfg = self.config
        self.allocator.start()
        self.flusher = self._make_flusher()
        if self.pool is not None:
            self._threads.append(
                CommitService(
                    self.segments,
                    self.pool,
                    interval_ms=cfg.commit_interval_ms,
                    least_pages=cfg.commit_least_pages,
                    thorough_interval_ms=cfg.commit_thorough_interval_ms,
                    on_committed=self.flusher,
                )
            )
        self.checkpoint_service = CheckpointService(
            cfg.store_dir,
            self.commitlog,
            self.checkpoint,
            self.consumer_offsets,
            interval_ms=cfg.checkpoint_interval_ms,
            guard=self.guard,
        )
        self.retention = RetentionService(
            self.commitlog,
            cfg,
            self.guard,
            self.consumer_offsets,
            prepare_next=self._prepare_next,
            clock_s=self._clock_s,
        )
        self.producer_state_service = ProducerStateService(
            self.producers,
            self.commitlog,
            cfg.producer_state_snapshot_interval_ms,
            is_master=self._is_master,
        )
        self._threads += [
            self.flusher,
            self.checkpoint_service,
            self.retention,
            self.producer_state_service,
        ]
        for thread in self._threads:
            thread.start()
        self.retention.run_once()  # measure the disk before the first append

    def close(self) -> None:
        """Flush and close cleanly; the next open takes the normal recovery path."""
        if not self._opened:
            return
        self._opened = False
        self._put_refusal = "the store is not open"
        with self.commitlog.lock:
            self.commitlog.refuse_reason = "the store is closing"
        for thread in self._threads:
            thread.stop()
        self.segments.commit(0)
        self.segments.flush(0)
        clean = self._write_final()
        self.allocator.stop()
        self.segments.close()
        if clean:
            remove_abort_file(self.config.store_dir)
        self._lock.release()
        if clean:
            log.info("store %s closed cleanly", self.config.store_dir)

    def _write_final(self) -> bool:
        """The final snapshot, checkpoint and consumer offsets. False when the disk is
        full: the close goes on, and the abort file stays, so the next open recovers as
        after a crash (the commitlog is flushed)."""
        clean = True
        for what, write in (
            ("the final snapshot", self.checkpoint_service.write_final),
            ("the consumer offsets", self.consumer_offsets.close),
        ):
            try:
                write()
            except OSError as exc:
                if not is_out_of_space(exc):
                    raise
                error = self.guard.out_of_space(exc, f"writing {exc.filename or what}")
                log.error("%s; closing without %s", error, what)
                clean = False
        return clean

    # -- messages ----------------------------------------------------------------
    def put(self, messages: Sequence[MessageLike], default_born_host: str = "") -> PutResult:
        """Validate, encode and append a batch; the returned future (SYNC_FLUSH) tells
        when it is durable. ``default_born_host`` stands for messages without one."""
        if self._put_refusal is not None:
            raise NotWritableError(self._put_refusal)
        records = self.encode(messages, default_born_host)
        return self._append(run_from_records(records))

    def put_run(self, chunks: Sequence[bytes]) -> PutResult:
        """Check and append records encoded by a producer (``tide.format.RunWriter``):
        ``chunks`` are runs, appended as one batch in order."""
        if self._put_refusal is not None:
            raise NotWritableError(self._put_refusal)
        looked_up: list[str] = []

        def write_queue_count(topic: str) -> int | None:
            looked_up.append(topic)  # once per topic of the run not in the cache
            return self._write_queue_count(topic)

        run = self._checked_run(chunks, write_queue_count, self._run_topics)
        if SCHEDULE_TOPIC in looked_up:
            self._run_topics.pop(SCHEDULE_TOPIC.encode(), None)  # grows: looked up each time
            queue_ids = [k[1] for k in run.queue_keys if k is not None and k[0] == SCHEDULE_TOPIC]
            grow_schedule_topic(self.topics, max(queue_ids, default=0))
        return self._append(run)

    def _topics_changed(self, _: TopicChange) -> None:
        self._run_topics = {}

    def _checked_run(
        self,
        chunks: Sequence[bytes],
        write_queue_count: Callable[[str], int | None] | None = None,
        cache: Topics | None = None,
    ) -> RecordRun:
        """``chunks`` joined and checked (topics it names created); ``write_queue_count``
        looks up a topic's write queues (default: the topic table's), ``cache`` keeps
        its answers (RunChecker.check)."""
        data = bytearray().join(chunks)  # one copy: the store patches it in place
        run, missing = self.run_checker.check(
            data,
            write_queue_count or self._write_queue_count,
            self.config.default_queue_nums,
            cache,
        )
        for topic in missing:
            self.topics.ensure(topic, self.config.default_queue_nums)
        return run

    def put_run_idempotent(
        self, chunks: Sequence[bytes], producer_id: str, epoch: int, first_seq: int
    ) -> PutResult:
        """An idempotent producer's batch (one queue, sequences ``first_seq`` on): appended
        once; a retry of a batch in the window is answered with the stored original
        (``duplicate``); a gap or an older batch raises SequenceError."""
        if self._put_refusal is not None:
            raise NotWritableError(self._put_refusal)
        run = self._checked_run(chunks)
        key = check_single_queue(run.queue_keys)
        last_seq = first_seq + len(run.sizes) - 1
        check_producer_properties(run.data, 0, run.sizes, producer_id, epoch, first_seq, last_seq)
        table = self.producers
        now_ms = self.commitlog.clock_ms()

        def check() -> AppendBatch | None:
            table.check_room(producer_id, now_ms)
            earlier = table.check(producer_id, key, epoch, first_seq, last_seq)
            if earlier is None:
                return None
            self.idempotent_duplicates += 1  # under the append lock
            return batch_of(earlier)

        def appended(batch: AppendBatch) -> None:
            table.record(producer_id, key, epoch, entry_of(batch, first_seq), now_ms)

        batch, fresh = self.commitlog.append_checked(run, check, appended)
        result = self._await(batch)
        return result if fresh else replace(result, duplicate=True)

    def put_producer_runs(
        self, chunks: Sequence[bytes], batches: Sequence[ProducerBatch]
    ) -> PutResult:
        """Several idempotent producers' batches (``chunks[i]`` is ``batches[i]``'s),
        checked, then appended as one (producer_runs.py); CoalescedRetryError when one
        of them is a retry. One batch is :meth:`put_run_idempotent`."""
        if len(chunks) == 1 and len(batches) == 1:
            one = batches[0]
            return self.put_run_idempotent(chunks, one.producer_id, one.epoch, one.first_seq)
        if self._put_refusal is not None:
            raise NotWritableError(self._put_refusal)
        run = self._checked_run(chunks)
        placed = place_batches(run, [len(chunk) for chunk in chunks], batches)
        table = self.producers
        now_ms = self.commitlog.clock_ms()

        def check() -> AppendBatch | None:
            check_batches(table, placed, now_ms)
            return None

        def appended(batch: AppendBatch) -> None:
            record_batches(table, placed, batch, now_ms)

        batch, _ = self.commitlog.append_checked(run, check, appended)
        return self._await(batch)

    def _append(self, run: RecordRun) -> PutResult:
        return self._await(self.commitlog.append(run))

    def _await(self, batch: AppendBatch) -> PutResult:
        durable = None
        if self.group_commit is not None and batch.sizes:
            durable = self.group_commit.request(batch.end_offset)
        if self.ha_waiter is not None and batch.sizes:
            return PutResult(batch, durable, self.ha_waiter.request(batch.end_offset))
        return PutResult(batch, durable)

    def _now_ms(self) -> int:
        """The store clock before the commitlog (which keeps it) exists."""
        return self._clock_ms() if self._clock_ms is not None else time.time_ns() // 1_000_000

    def _is_master(self) -> bool:
        return not self._slave

    def refuse_puts(self, reason: str) -> None:
        """Refuse every put with ``reason`` from now on (a slave: produce to the master)."""
        self._put_refusal = reason
        self._slave = True

    def encode(
        self, messages: Sequence[MessageLike], default_born_host: str = ""
    ) -> list[EncodedRecord]:
        """Validate and encode a batch. Unknown topics are auto-created (when allowed)
        only once the whole batch has passed, so a rejected batch changes nothing."""
        queue_counts: dict[str, int] = {}
        missing: list[str] = []
        for msg in messages:
            topic = msg.topic
            if topic not in queue_counts:
                count = self._write_queue_count(topic)
                if count is None:
                    missing.append(topic)
                    count = self.config.default_queue_nums
                queue_counts[topic] = count
        records = self.codec.encode_batch(messages, queue_counts, default_born_host)
        for topic in missing:
            self.topics.ensure(topic, self.config.default_queue_nums)
        if SCHEDULE_TOPIC in queue_counts:
            queue_ids = [m.queue_id for m in messages if m.topic == SCHEDULE_TOPIC]
            grow_schedule_topic(self.topics, max(queue_ids))
        return records

    def _topic_name(self, name: bytes) -> str:
        """A run's topic bytes as a checked name (InvalidMessageError if it is not)."""
        try:
            topic = name.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidMessageError(f"topic {quote(name)} is not UTF-8") from None
        self.codec.topic_bytes(topic)  # checks the name (cached)
        return topic

    def _write_queue_count(self, topic: str) -> int | None:
        """The topic's write queue count; None for an unknown topic that may be created."""
        self.codec.topic_bytes(topic)  # validates the name first
        cfg = self.topics.get(topic)
        if cfg is None:
            if not self.config.auto_create_topics:
                raise TopicNotFoundError(
                    f"topic {quote(topic)} does not exist and auto-create is off; "
                    "create it with UpsertTopic"
                )
            return None
        if not cfg.perm & PERM_WRITE:
            raise NotWritableError(f"topic {quote(topic)} is not writable (perm {cfg.perm})")
        return system_topics.write_queue_count(cfg)

    def queue_max_offset(self, topic: str, queue_id: int) -> int:
        """The queue's next queue offset (what its next message gets): the store assigns
        queue offsets, so this is the queue's true max (a dispatch's may lag)."""
        return self.commitlog.offsets.next_offsets.get((topic, queue_id), 0)

    def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record a group's offset; refuse one past the queue's max (it would make the
        group's next pull skip every message produced until the queue reaches it). One
        below the queue's min is taken: retention may have just moved the min, and the
        next pull answers OFFSET_ILLEGAL with the min, skipping nothing that exists."""
        self.consumer_offsets.commit(
            group, topic, queue_id, offset, self.queue_max_offset(topic, queue_id)
        )

    def delete_topic(self, topic: str) -> bool:
        existed = self.topics.delete(topic)
        with self.commitlog.lock:
            self.commitlog.offsets.remove_topic(topic)
        self.consumer_offsets.delete_topic(topic)
        return existed

    def status(self) -> StoreStatus:
        segments = self.segments
        self.guard.refresh()
        return StoreStatus(
            min_offset=segments.min_offset,
            max_offset=segments.max_offset,
            committed_offset=segments.committed_offset,
            flushed_offset=segments.flushed_offset,
            segment_count=len(segments.segments),
            disk_usage_ratio=self.retention.last_ratio,
            writable=self.commitlog.writable,
            topic_count=len(self.topics.list()),
        )

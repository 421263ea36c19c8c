"""The duplicate window of idempotent producers (Kafka's producer state, NATS's
``Nats-Msg-Id`` window): per producer id and queue, the last batches appended and their
original results.

Checked and updated under the commitlog's append lock (the storage is the only writer,
so no two appends of one producer and queue race). Durable through SIGKILL without a
write per append: the records carry ``__PID`` / ``__PSEQ`` (tide.format), so recovery
loads the last snapshot (``config/producerState.json``, written every
``producer_state_snapshot_interval_ms`` when producers changed, from the changes taken
under the lock: :meth:`ProducerStateTable.take_changes`, and at close) and replays the
records after its offset (producer_state_service.py). Bounded:
``producer_window_batches`` batches per producer and queue, ``max_idempotent_producers``
producers, ids idle for ``producer_id_expiry_ms`` dropped.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.storage.engine.commitlog import AppendBatch
from services.storage.engine.errors import (
    AlreadyStoredError,
    FencedProducerError,
    InvalidMessageError,
    ProducerLimitError,
    SequenceError,
)
from tide.files import ConfigFormatError, parse_config_bytes, write_json_bytes_atomically
from tide.format import (
    PRODUCER_EPOCH,
    PRODUCER_ID,
    PRODUCER_SEQ,
    PRODUCER_STATE_FILE,
    BatchEntry,
    ProducerEntry,
    ProducerStateError,
    ProducerStateSnapshot,
    decode_producer_state,
    encode_producer_state,
    format_sequences,
    parse_sequences,
    record_properties,
)
from tide.quoting import quote

log = logging.getLogger("tide.storage.producer_state")
QueueKey = tuple[str, int]


class ProducerStateTable:
    def __init__(
        self,
        config_dir: Path,
        *,
        window_batches: int,
        expiry_ms: int,
        max_producers: int,
    ) -> None:
        self._path = config_dir / PRODUCER_STATE_FILE
        self.window_batches = window_batches
        self.expiry_ms = expiry_ms
        self.max_producers = max_producers
        self._producers: dict[str, ProducerEntry] = {}
        # Snapshots are written outside the append lock from the changes taken under it
        # (take_changes): the producers recorded and those expired since the last one,
        # or everything after the table was replaced (load, install, a crash's cut).
        self._changed: set[str] = set()
        self._removed: set[str] = set()
        self._all_changed = True
        self._write_lock = threading.Lock()

    # -- under the append lock ---------------------------------------------------
    def check(
        self, pid: str, key: QueueKey, epoch: int, first: int, last: int
    ) -> BatchEntry | None:
        """The stored batch ``first..last`` is a retry of (answer its result), or None when
        it is the next batch (or the first of a newer epoch). SequenceError for a gap or
        an overlap, AlreadyStoredError for a batch older than the window (every sequence
        below the next one was stored: they are taken only in order), FencedProducerError
        for an older epoch."""
        entry = self._producers.get(pid)
        if entry is not None and epoch != entry.epoch:
            if epoch > entry.epoch:
                return None  # a new epoch: its sequences start afresh (record() resets)
            raise FencedProducerError(
                f"producer {pid}: epoch {epoch} is older than its current epoch "
                f"{entry.epoch}: a newer instance of this producer took over"
            )
        batches = entry.queues.get(key) if entry is not None else None
        if not batches:
            # Unknown (new, or expired): any start is taken, as Kafka does once a
            # producer's state is gone; a retry of an expired batch is stored again.
            return None
        for batch in batches:
            if batch.first_seq == first:
                if batch.last_seq != last:
                    raise SequenceError(
                        f"producer {pid} queue {key[0]}:{key[1]}: sequences {first}-{last} "
                        f"overlap the stored batch {batch.first_seq}-{batch.last_seq} with "
                        "another size: retry a batch exactly as first sent"
                    )
                return batch
        expected = batches[-1].last_seq + 1
        if last < batches[0].first_seq:
            raise AlreadyStoredError(
                f"producer {pid} queue {key[0]}:{key[1]}: sequences {first}-{last} were "
                f"stored before, older than the window of {len(batches)} batches kept "
                "(their results are no longer known)"
            )
        if first != expected:
            kind = "a gap" if first > expected else "older than the window"
            raise SequenceError(
                f"producer {pid} queue {key[0]}:{key[1]}: first sequence {first} is {kind}; "
                f"the next expected is {expected} (the last {len(batches)} batches are kept)"
            )
        return None

    def record(self, pid: str, key: QueueKey, epoch: int, batch: BatchEntry, now_ms: int) -> None:
        entry = self._producers.get(pid)
        if entry is None:
            if len(self._producers) >= self.max_producers:
                self.expire(now_ms)
            entry = self._producers[pid] = ProducerEntry(now_ms, epoch=epoch)
        elif epoch > entry.epoch:
            entry.queues.clear()
            entry.epoch = epoch
        entry.last_append_ms = max(entry.last_append_ms, now_ms)
        self._changed.add(pid)
        batches = entry.queues.setdefault(key, [])
        batches.append(batch)
        del batches[: -self.window_batches]

    def check_room(self, pid: str, now_ms: int) -> None:
        """ProducerLimitError when a new producer would not fit (before any write)."""
        if pid in self._producers or len(self._producers) < self.max_producers:
            return
        self.expire(now_ms)
        if len(self._producers) >= self.max_producers:
            raise ProducerLimitError(
                f"{len(self._producers)} idempotent producers are active, the "
                f"max_idempotent_producers limit: wait for idle ids to expire "
                f"({self.expiry_ms} ms) or raise the limit"
            )

    def check_room_for(self, pids: Sequence[str], now_ms: int) -> None:
        """:meth:`check_room` for several producers' batches appended together."""
        new = len({pid for pid in pids if pid not in self._producers})
        if len(self._producers) + new <= self.max_producers:
            return
        self.expire(now_ms)
        if len(self._producers) + new > self.max_producers:
            raise ProducerLimitError(
                f"{len(self._producers)} idempotent producers are active and {new} more "
                f"would pass the max_idempotent_producers limit ({self.max_producers}): "
                f"wait for idle ids to expire ({self.expiry_ms} ms) or raise the limit"
            )

    def expire(self, now_ms: int) -> int:
        """Drop the producers idle for expiry_ms; how many."""
        cutoff = now_ms - self.expiry_ms
        idle = [pid for pid, e in self._producers.items() if e.last_append_ms < cutoff]
        for pid in idle:
            del self._producers[pid]
            self._changed.discard(pid)
            self._removed.add(pid)
        return len(idle)

    def copy(self, commitlog_offset: int) -> ProducerStateSnapshot:
        """A copy of the whole table (the batches are never changed, only dropped)."""
        producers = {pid: _copy_entry(e) for pid, e in self._producers.items()}
        return ProducerStateSnapshot(commitlog_offset, producers)

    def take_changes(self) -> ProducerChanges | None:
        """What changed since the last call, copied (O(changed producers): this runs
        under the append lock), and forgotten here; None when nothing did."""
        if self._all_changed:
            self._all_changed = False
            self._changed.clear()
            self._removed.clear()
            return ProducerChanges(self.copy(0).producers, set(), everything=True)
        if not self._changed and not self._removed:
            return None
        changed = {pid: _copy_entry(self._producers[pid]) for pid in self._changed}
        removed = self._removed
        self._changed, self._removed = set(), set()
        return ProducerChanges(changed, removed, everything=False)

    def drop_from(self, end: int) -> None:
        """Forget the batches at or past ``end`` (a crash cut them off the commitlog)."""
        self._all_changed = True
        for entry in self._producers.values():
            for key, batches in entry.queues.items():
                entry.queues[key] = [b for b in batches if b.physical_offsets[-1] < end]

    @property
    def producer_count(self) -> int:
        return len(self._producers)

    # -- files -------------------------------------------------------------------
    def write(self, snapshot: ProducerStateSnapshot) -> None:
        data = json.dumps(encode_producer_state(snapshot), separators=(",", ":")).encode()
        with self._write_lock:
            write_json_bytes_atomically(self._path, data)

    def load(self) -> int:
        """Read the snapshot (if any); the commitlog offset to replay from."""
        try:
            content = self._path.read_bytes()
        except FileNotFoundError:
            return 0
        try:
            snapshot = _snapshot_of(content)
        except ConfigFormatError as exc:
            # Rebuilt from the whole commitlog instead: slower, never wrong.
            log.warning("%s unreadable (%s): replaying the whole commitlog", self._path, exc)
            return 0
        self._producers = snapshot.producers
        self._all_changed = True
        return snapshot.commitlog_offset

    def clear(self) -> None:
        """Forget every producer (a snapshot older than the commitlog replayed instead)."""
        self._producers = {}
        self._all_changed = True

    def install(self, content: bytes) -> None:
        """A master's copy (a slave): checked whole, written, served."""
        snapshot = _snapshot_of(content)
        with self._write_lock:
            write_json_bytes_atomically(self._path, content)
        self._producers = snapshot.producers
        self._all_changed = True

    # -- recovery ----------------------------------------------------------------
    def replay(self, records: Iterable[tuple[int, int, str, int, int, int, dict[str, str]]]) -> int:
        """Add the batches of ``records`` (offset, size, topic, queue id, queue offset,
        store time, properties) in commitlog order; how many batches."""
        current: tuple[str, QueueKey, int, int, int] | None = None
        batch: BatchEntry | None = None
        count = 0
        for offset, size, topic, queue_id, queue_offset, store_ms, props in records:
            pid = props.get(PRODUCER_ID)
            if pid is None:
                continue
            try:
                first, last = parse_sequences(props.get(PRODUCER_SEQ, ""))
            except ProducerStateError as exc:
                log.warning("record at %d: %s; not replayed", offset, exc)
                continue
            epoch_text = props.get(PRODUCER_EPOCH, "0")
            epoch = int(epoch_text) if epoch_text.isdigit() else 0
            here = (pid, (topic, queue_id), epoch, first, last)
            if here != current or batch is None or len(batch.sizes) > last - first:
                batch = BatchEntry(first, last, store_ms, [], [], [])
                current = here
                self.record(pid, here[1], epoch, batch, store_ms)
                count += 1
            batch.physical_offsets.append(offset)
            batch.queue_offsets.append(queue_offset)
            batch.sizes.append(size)
        return count


@dataclass(frozen=True, slots=True)
class ProducerChanges:
    """The producers changed since the last snapshot (copies), those dropped, or (with
    ``everything``) the whole table in ``changed``."""

    changed: dict[str, ProducerEntry]
    removed: set[str]
    everything: bool


def _copy_entry(entry: ProducerEntry) -> ProducerEntry:
    """A copy a snapshot can keep: its own lists of the (never changed) batches."""
    queues = {key: list(batches) for key, batches in entry.queues.items()}
    return ProducerEntry(entry.last_append_ms, queues, entry.epoch)


def _snapshot_of(content: bytes) -> ProducerStateSnapshot:
    """The snapshot in a ``producerState.json``'s bytes; ConfigFormatError when they are
    not one (not UTF-8 JSON, or not the layout)."""
    raw = parse_config_bytes(PRODUCER_STATE_FILE, content)
    try:
        return decode_producer_state(raw)
    except ProducerStateError as exc:
        raise ConfigFormatError(f"{PRODUCER_STATE_FILE}: {exc}") from None


def check_single_queue(keys: Iterable[QueueKey | None]) -> QueueKey:
    """The one queue of an idempotent batch (InvalidMessageError otherwise)."""
    found: QueueKey | None = None
    for key in keys:
        if key is None or (found is not None and key != found):
            raise InvalidMessageError(
                "an idempotent batch goes to one queue (its sequences are per queue): "
                "split it by queue"
            )
        found = key
    if found is None:
        raise InvalidMessageError("an idempotent batch is empty")
    return found


def batch_of(entry: BatchEntry) -> AppendBatch:
    """The original result of a stored batch, as the append returned it."""
    end = entry.physical_offsets[-1] + entry.sizes[-1]
    return AppendBatch(
        entry.store_timestamp_ms,
        list(entry.physical_offsets),
        list(entry.sizes),
        list(entry.queue_offsets),
        end,
    )


def entry_of(batch: AppendBatch, first_seq: int) -> BatchEntry:
    return BatchEntry(
        first_seq,
        first_seq + len(batch.sizes) - 1,
        batch.store_timestamp_ms,
        list(batch.physical_offsets),
        list(batch.queue_offsets),
        list(batch.sizes),
    )


def check_producer_properties(
    data: bytearray, start: int, sizes: Sequence[int], pid: str, epoch: int, first: int, last: int
) -> None:
    """The first and last records of the batch at ``start`` in ``data`` (of ``sizes``)
    carry ``__PID``, ``__PSEQ`` and ``__PEPOCH`` as the request says: recovery rebuilds
    the window from them (InvalidMessageError otherwise)."""
    want = {PRODUCER_ID: pid, PRODUCER_SEQ: format_sequences(first, last)}
    if epoch:
        want[PRODUCER_EPOCH] = str(epoch)
    ends = {start: sizes[0], start + sum(sizes) - sizes[-1]: sizes[-1]}
    for pos, size in ends.items():
        props = record_properties(data, pos, size)
        for name, value in want.items():
            if props.get(name) != value:
                raise InvalidMessageError(
                    f"an idempotent record's {name} property is {quote(props.get(name, ''))}, "
                    f"not {quote(value)}: encode {PRODUCER_ID} and {PRODUCER_SEQ} as the "
                    "request's producer_id and sequences (docs/formats.md)"
                )

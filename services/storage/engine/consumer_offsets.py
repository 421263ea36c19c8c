"""Committed consumer offsets: ``config/consumerOffset.json`` in RocketMQ's shape.

``{"offsetTable": {"<topic>@<group>": {"<queue_id>": <offset>}}}``

Persist policy (RocketMQ's): commits live in memory and reach the file at most every
``persist_interval_ms``, when the owner calls :meth:`ConsumerOffsets.maybe_persist`,
and on :meth:`ConsumerOffsets.close`. **A crash loses up to that interval of
commits**; consumers then re-read from the older offset (at-least-once delivery).
With ``persist_interval_ms == 0`` every commit is written before it returns.
"""

from __future__ import annotations

import threading
from pathlib import Path

from services.storage.engine.topic_table import MAX_QUEUE_NUMS
from tide.files import (
    ConfigFormatError,
    ConfigLimitError,
    load_json_with_fallback,
    parse_config_bytes,
    write_json_atomically,
    write_json_bytes_atomically,
)
from tide.naming import consumer_group_error, topic_error
from tide.quoting import quote

__all__ = [
    "CONSUMER_OFFSETS_FILE",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_PERSIST_INTERVAL_MS",
    "MAX_OFFSET",
    "ConfigLimitError",
    "ConsumerOffsets",
]

CONSUMER_OFFSETS_FILE = "consumerOffset.json"
DEFAULT_PERSIST_INTERVAL_MS = 5_000
DEFAULT_MAX_ENTRIES = 1_000_000
MAX_OFFSET = 2**63 - 1
_KEY_SEPARATOR = "@"

# (topic, group) -> {queue_id: offset}
_Table = dict[tuple[str, str], dict[int, int]]


class ConsumerOffsets:
    """Thread-safe table of committed offsets, bounded to ``max_entries`` queue entries."""

    def __init__(
        self,
        config_dir: Path,
        *,
        persist_interval_ms: int = DEFAULT_PERSIST_INTERVAL_MS,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        if persist_interval_ms < 0:
            raise ValueError(f"persist_interval_ms is {persist_interval_ms}; it must be >= 0")
        config_dir.mkdir(parents=True, exist_ok=True)
        self._path = config_dir / CONSUMER_OFFSETS_FILE
        self._persist_interval_ms = persist_interval_ms
        self._max_entries = max_entries
        self._lock = threading.Lock()  # guards the fields below
        self._persist_lock = threading.Lock()  # one writer; snapshots reach the file in order
        self._table, self._entry_count = _load(self._path, max_entries)
        self._dirty = False
        self._closed = False
        self._last_persist_ms: int | None = None

    @property
    def path(self) -> Path:
        return self._path

    @property
    def entry_count(self) -> int:
        """Number of (group, topic, queue) entries held."""
        with self._lock:
            return self._entry_count

    def commit(
        self, group: str, topic: str, queue_id: int, offset: int, max_offset: int = MAX_OFFSET
    ) -> None:
        """Record ``offset`` as the group's next offset to consume in the queue;
        ``max_offset``: the queue's (MessageStore.commit_consumer_offset)."""
        _check_key(group, topic, queue_id)
        if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
            raise ValueError(f"offset is {offset!r}; it must be 0..{MAX_OFFSET}")
        if offset > max_offset:
            raise ValueError(
                f"offset {offset} is past the max offset {max_offset} of queue {queue_id} of "
                f"topic {quote(topic)} (the offset its next message gets): commit at most "
                f"{max_offset}"
            )
        with self._lock:
            self._check_open()
            queues = self._table.get((topic, group))
            if queues is None or queue_id not in queues:
                self._check_room(group, topic, queue_id)
                self._entry_count += 1
            self._table.setdefault((topic, group), {})[queue_id] = offset
            self._dirty = True
        if self._persist_interval_ms == 0:
            self.persist()

    def get(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed in this queue."""
        _check_key(group, topic, queue_id)
        with self._lock:
            return self._table.get((topic, group), {}).get(queue_id, -1)

    def committed(self) -> dict[tuple[str, str], dict[int, int]]:
        """A copy of the table: (topic, group) -> {queue id: committed offset}."""
        with self._lock:
            return {key: dict(queues) for key, queues in self._table.items()}

    def delete_topic(self, topic: str) -> int:
        """Forget every group's offsets in ``topic``; returns how many entries went."""
        with self._lock:
            self._check_open()
            keys = [key for key in self._table if key[0] == topic]
            removed = sum(len(self._table.pop(key)) for key in keys)
            self._entry_count -= removed
            self._dirty = self._dirty or removed > 0
        if removed and self._persist_interval_ms == 0:
            self.persist()
        return removed

    def maybe_persist(self, now_ms: int) -> bool:
        """Persist when there are unwritten commits and the interval has passed."""
        with self._lock:
            last = self._last_persist_ms
            due = last is None or now_ms - last >= self._persist_interval_ms
            if not (self._dirty and due):
                return False
            self._last_persist_ms = now_ms
        self.persist()
        return True

    def persist(self) -> None:
        """Write the table now (atomically, see ``tide.files``)."""
        with self._persist_lock:
            with self._lock:
                snapshot = {key: dict(queues) for key, queues in self._table.items()}
                self._dirty = False
            try:
                write_json_atomically(self._path, encode_offsets(snapshot))
            except BaseException:
                with self._lock:
                    self._dirty = True
                raise

    def persist_if_dirty(self) -> bool:
        """Write the table now if it holds unwritten commits (a master answering a
        slave's GetMetadata: the file then says what the table says)."""
        with self._lock:
            dirty = self._dirty
        if dirty:
            self.persist()
        return dirty

    def install(self, content: bytes) -> None:
        """Adopt another store's ``consumerOffset.json`` byte for byte (a slave's copy of
        its master's): checked whole first (nothing written when it is not a valid table
        within this table's limit), written atomically, then held as the table."""
        doc = parse_config_bytes(CONSUMER_OFFSETS_FILE, content)
        table, count = decode_offsets(doc, self._max_entries)
        with self._persist_lock:  # no persist() of the older table after this write
            write_json_bytes_atomically(self._path, content)
            with self._lock:
                self._table, self._entry_count, self._dirty = table, count, False

    def close(self) -> None:
        """Persist pending commits; later commits raise. Idempotent; retries a failed write."""
        with self._lock:
            self._closed = True
            dirty = self._dirty
        if dirty:
            self.persist()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"consumer offsets {self._path} are closed")

    def _check_room(self, group: str, topic: str, queue_id: int) -> None:
        if self._entry_count >= self._max_entries:
            raise ConfigLimitError(
                f"cannot commit an offset for group {quote(group)}, topic {quote(topic)}, queue "
                f"{queue_id}: the table already holds the limit of {self._max_entries} "
                "(group, topic, queue) entries; delete unused topics or raise the limit"
            )


def encode_offsets(table: _Table) -> dict[str, object]:
    """The ``consumerOffset.json`` document."""
    return {
        "offsetTable": {
            f"{topic}{_KEY_SEPARATOR}{group}": {str(q): queues[q] for q in sorted(queues)}
            for (topic, group), queues in sorted(table.items())
        }
    }


def decode_offsets(doc: object, max_entries: int) -> tuple[_Table, int]:
    """Parse and validate a ``consumerOffset.json`` document; returns (table, entry count)."""
    if not isinstance(doc, dict):
        raise ConfigFormatError(f"the document must be an object, got {type(doc).__name__}")
    raw_table = doc.get("offsetTable")
    if not isinstance(raw_table, dict):
        raise ConfigFormatError(f"offsetTable must be an object, got {raw_table!r:.80}")
    table: _Table = {}
    count = 0
    for key, raw_queues in raw_table.items():
        queues = _decode_queues(key, raw_queues)
        count += len(queues)
        if count > max_entries:
            raise ConfigLimitError(f"more than the limit of {max_entries} offset entries")
        table[_split_key(key)] = queues
    return table, count


def _split_key(key: str) -> tuple[str, str]:
    topic, separator, group = key.partition(_KEY_SEPARATOR)
    if not separator:
        raise ConfigFormatError(f"key {key!r:.300} is not '<topic>@<group>'")
    error = topic_error(topic) or consumer_group_error(group)
    if error is not None:
        raise ConfigFormatError(f"key {key!r:.300}: {error}")
    return topic, group


def _decode_queues(key: str, raw: object) -> dict[int, int]:
    if not isinstance(raw, dict):
        raise ConfigFormatError(f"{key!r:.300}: must map queue ids to offsets, got {raw!r:.80}")
    queues: dict[int, int] = {}
    for raw_queue, offset in raw.items():
        if not raw_queue.isascii() or not raw_queue.isdigit() or len(raw_queue) > 4:
            raise ConfigFormatError(f"{key!r:.300}: queue id {raw_queue!r:.40} is not a number")
        queue_id = int(raw_queue)
        if queue_id >= MAX_QUEUE_NUMS:
            raise ConfigFormatError(f"{key!r:.300}: queue id {queue_id} is >= {MAX_QUEUE_NUMS}")
        if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
            raise ConfigFormatError(f"{key!r:.300}: queue {queue_id} offset is {offset!r:.40}")
        queues[queue_id] = offset
    return queues


def _load(path: Path, max_entries: int) -> tuple[_Table, int]:
    doc, _source = load_json_with_fallback(path)
    if doc is None:
        return {}, 0
    try:
        return decode_offsets(doc, max_entries)
    except (ConfigFormatError, ConfigLimitError) as exc:
        raise type(exc)(f"{path}: {exc}") from exc


def _check_key(group: str, topic: str, queue_id: int) -> None:
    error = consumer_group_error(group) or topic_error(topic)
    if error is not None:
        raise ValueError(error)
    if type(queue_id) is not int or not 0 <= queue_id < MAX_QUEUE_NUMS:
        raise ValueError(f"queue id is {queue_id!r}; it must be 0..{MAX_QUEUE_NUMS - 1}")

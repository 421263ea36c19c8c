"""The topic table: ``config/topics.json`` in RocketMQ's TopicConfigManager shape.

``{"topicConfigTable": {"<topic>": {"topicName": "...", "readQueueNums": 4,
"writeQueueNums": 4, "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0,
"order": false, "attributes": {"message.type": "FIFO"}}}, "dataVersion": {"timestamp":
<ms>, "counter": <n>}}`` (``attributes``: RocketMQ 5's topic attributes, written only when
the topic has some, as a RocketMQ 4 file has none).

Every change is written with :func:`write_json_atomically` before it becomes visible,
bumps the data version, and is then reported to the listeners.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tide.files import (
    ConfigFormatError,
    ConfigLimitError,
    load_json_with_fallback,
    parse_config_bytes,
    write_json_atomically,
    write_json_bytes_atomically,
)
from tide.format import topic_message_type
from tide.limits import PROPERTIES_MAX_BYTES, PROPERTIES_MAX_COUNT, QUEUE_NUMS_MAX
from tide.naming import topic_error
from tide.quoting import quote

_log = logging.getLogger("tide.storage.config")

TOPICS_FILE = "topics.json"
PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4
DEFAULT_PERM = PERM_READ | PERM_WRITE
MAX_PERM = PERM_READ | PERM_WRITE | PERM_INHERIT
MAX_QUEUE_NUMS = QUEUE_NUMS_MAX  # one limit for every service (tide.limits)
MAX_TOPICS = 100_000
MAX_TOPIC_SYS_FLAG = 2**31 - 1
TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")
# RocketMQ's TopicConfig defaults, used for fields a stored entry leaves out.
_ROCKETMQ_DEFAULT_QUEUE_NUMS = 16

_T = TypeVar("_T")

DataVersion = tuple[int, int]
"""(timestamp_ms, counter), RocketMQ's DataVersion."""


@dataclass(frozen=True, slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = DEFAULT_PERM
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    # RocketMQ 5's topic attributes ("message.type" -> "FIFO", ...); never mutated.
    attributes: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }
        if self.attributes:
            doc["attributes"] = dict(self.attributes)
        return doc

    @classmethod
    def from_json(cls, key: str, entry: object) -> TopicConfig:
        """Parse one ``topicConfigTable`` entry; missing fields take RocketMQ's defaults."""
        if not isinstance(entry, dict):
            raise ConfigFormatError(f"topic {quote(key)}: entry must be an object, got {entry!r}")
        where = f"topic {quote(key)}"
        name = _typed(entry, where, "topicName", str, key)
        if name != key:
            raise ConfigFormatError(
                f"topic {quote(key)}: topicName is {quote(name)}, not the table key"
            )
        default_nums = _ROCKETMQ_DEFAULT_QUEUE_NUMS
        return cls(
            topic_name=name,
            read_queue_nums=_typed(entry, where, "readQueueNums", int, default_nums),
            write_queue_nums=_typed(entry, where, "writeQueueNums", int, default_nums),
            perm=_typed(entry, where, "perm", int, DEFAULT_PERM),
            topic_filter_type=_typed(entry, where, "topicFilterType", str, "SINGLE_TAG"),
            topic_sys_flag=_typed(entry, where, "topicSysFlag", int, 0),
            order=_typed(entry, where, "order", bool, False),
            attributes=_attributes(entry, where),
        )


def topic_config_error(cfg: TopicConfig) -> str | None:
    """What is wrong with this topic config, or None when it is valid."""
    name_error = topic_error(cfg.topic_name)
    if name_error is not None:
        return name_error
    for label, nums in (("read", cfg.read_queue_nums), ("write", cfg.write_queue_nums)):
        error = queue_nums_error(nums)
        if error is not None:
            return f"topic {quote(cfg.topic_name)}: {label} {error}"
    if type(cfg.perm) is not int or not 0 <= cfg.perm <= MAX_PERM:
        return (
            f"topic {quote(cfg.topic_name)}: perm is {cfg.perm!r}; it must be 0..{MAX_PERM} "
            f"(bits: {PERM_READ} read, {PERM_WRITE} write, {PERM_INHERIT} inherit)"
        )
    return _other_fields_error(cfg)


def queue_nums_error(nums: int) -> str | None:
    """What is wrong with a queue count, or None when it is valid."""
    if type(nums) is not int or not 1 <= nums <= MAX_QUEUE_NUMS:
        return f"queue count is {nums!r}; it must be 1..{MAX_QUEUE_NUMS}"
    return None


def _other_fields_error(cfg: TopicConfig) -> str | None:
    if cfg.topic_filter_type not in TOPIC_FILTER_TYPES:
        return (
            f"topic {quote(cfg.topic_name)}: topic filter type is {cfg.topic_filter_type!r}; "
            f"it must be one of {', '.join(TOPIC_FILTER_TYPES)}"
        )
    if type(cfg.topic_sys_flag) is not int or not 0 <= cfg.topic_sys_flag <= MAX_TOPIC_SYS_FLAG:
        return (
            f"topic {quote(cfg.topic_name)}: topic sys flag is {cfg.topic_sys_flag!r}; "
            f"it must be 0..{MAX_TOPIC_SYS_FLAG}"
        )
    if type(cfg.order) is not bool:
        return f"topic {quote(cfg.topic_name)}: order is {cfg.order!r}; it must be true or false"
    return _attributes_error(cfg)


def _attributes_error(cfg: TopicConfig) -> str | None:
    """The attributes' bounds (a message's properties': tide.limits) and the message
    type's value."""
    attributes = cfg.attributes
    where = f"topic {quote(cfg.topic_name)}"
    if len(attributes) > PROPERTIES_MAX_COUNT:
        return (
            f"{where}: {len(attributes)} attributes; the limit is {PROPERTIES_MAX_COUNT} "
            "(PROPERTIES_MAX_COUNT)"
        )
    for name, value in attributes.items():
        size = len(name.encode()) + len(value.encode())
        if not name or size > PROPERTIES_MAX_BYTES:
            return (
                f"{where}: attribute {quote(name)} must have a name, and name and value at "
                f"most {PROPERTIES_MAX_BYTES} bytes (PROPERTIES_MAX_BYTES)"
            )
    try:
        topic_message_type(attributes)
    except ValueError as exc:
        return f"{where}: {exc}"
    return None


@dataclass(frozen=True, slots=True)
class TopicChange:
    """What a listener is told: ``config`` is None when the topic was deleted."""

    topic: str
    config: TopicConfig | None
    data_version: DataVersion


TopicListener = Callable[[TopicChange], None]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class TopicTable:
    """Thread-safe topic table persisted in ``<config_dir>/topics.json``.

    Listeners run after the change is on disk, outside the table's lock, in the
    changing thread; two concurrent changes may reach a listener in either order
    (compare ``data_version``). A listener that raises is logged and does not undo
    the change or stop the other listeners.
    """

    def __init__(
        self,
        config_dir: Path,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        max_topics: int = MAX_TOPICS,
    ) -> None:
        config_dir.mkdir(parents=True, exist_ok=True)
        self._path = config_dir / TOPICS_FILE
        self._clock_ms = clock_ms
        self._max_topics = max_topics
        self._lock = threading.Lock()
        self._listeners: builtins.list[TopicListener] = []
        self._topics, self._data_version = _load(self._path, max_topics)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def data_version(self) -> DataVersion:
        with self._lock:
            return self._data_version

    def add_listener(self, listener: TopicListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def get(self, topic: str) -> TopicConfig | None:
        with self._lock:
            return self._topics.get(topic)

    def list(self) -> builtins.list[TopicConfig]:
        """Every topic, sorted by name."""
        with self._lock:
            return [self._topics[name] for name in sorted(self._topics)]

    def upsert(self, cfg: TopicConfig) -> TopicConfig:
        """Create or replace a topic; an identical config changes nothing."""
        _check(cfg)
        with self._lock:
            if self._topics.get(cfg.topic_name) == cfg:
                return cfg
            self._check_room(cfg.topic_name)
            change, listeners = self._apply(cfg.topic_name, cfg)
        self._notify(change, listeners)
        return cfg

    def ensure(self, topic: str, default_queue_nums: int) -> TopicConfig:
        """The topic's config, creating it with ``default_queue_nums`` queues if absent."""
        cfg = TopicConfig(topic, default_queue_nums, default_queue_nums)
        _check(cfg)
        with self._lock:
            existing = self._topics.get(topic)
            if existing is not None:
                return existing
            self._check_room(topic)
            change, listeners = self._apply(topic, cfg)
        self._notify(change, listeners)
        return cfg

    def delete(self, topic: str) -> bool:
        """Remove a topic; False when it did not exist."""
        with self._lock:
            if topic not in self._topics:
                return False
            change, listeners = self._apply(topic, None)
        self._notify(change, listeners)
        return True

    def install(self, content: bytes) -> None:
        """Adopt another store's ``topics.json`` byte for byte (a slave's copy of its
        master's, RocketMQ's SlaveSynchronize): checked whole first (ConfigFormatError or
        ConfigLimitError, nothing written), written atomically, then the table and its data
        version are the file's. Listeners hear of every topic added, changed or removed."""
        doc = parse_config_bytes(TOPICS_FILE, content)
        topics, version = decode_topics(doc)
        if len(topics) > self._max_topics:
            raise ConfigLimitError(
                f"{TOPICS_FILE} holds {len(topics)} topics; the limit is {self._max_topics}"
            )
        with self._lock:
            write_json_bytes_atomically(self._path, content)
            old, self._topics, self._data_version = self._topics, topics, version
            listeners = builtins.list(self._listeners)
        for name in sorted(old.keys() | topics.keys()):
            if old.get(name) != topics.get(name):
                self._notify(TopicChange(name, topics.get(name), version), listeners)

    def _check_room(self, topic: str) -> None:
        if topic not in self._topics and len(self._topics) >= self._max_topics:
            raise ConfigLimitError(
                f"cannot create topic {quote(topic)}: the table already holds the limit of "
                f"{self._max_topics} topics"
            )

    def _apply(
        self, topic: str, cfg: TopicConfig | None
    ) -> tuple[TopicChange, builtins.list[TopicListener]]:
        """Persist the table with one topic set or removed, then adopt it. Holds the lock."""
        topics = dict(self._topics)
        if cfg is None:
            del topics[topic]
        else:
            topics[topic] = cfg
        version = (self._clock_ms(), self._data_version[1] + 1)
        write_json_atomically(self._path, encode_topics(topics, version))
        self._topics, self._data_version = topics, version
        return TopicChange(topic, cfg, version), builtins.list(self._listeners)

    def _notify(self, change: TopicChange, listeners: builtins.list[TopicListener]) -> None:
        for listener in listeners:
            try:
                listener(change)
            except Exception:
                _log.exception("topic listener %r failed on %r", listener, change)


def encode_topics(topics: Mapping[str, TopicConfig], version: DataVersion) -> dict[str, object]:
    """The ``topics.json`` document."""
    return {
        "topicConfigTable": {name: topics[name].to_json() for name in sorted(topics)},
        "dataVersion": {"timestamp": version[0], "counter": version[1]},
    }


def decode_topics(doc: object) -> tuple[dict[str, TopicConfig], DataVersion]:
    """Parse and validate a ``topics.json`` document."""
    if not isinstance(doc, dict):
        raise ConfigFormatError(f"the document must be an object, got {type(doc).__name__}")
    table = doc.get("topicConfigTable")
    if not isinstance(table, dict):
        raise ConfigFormatError(f"topicConfigTable must be an object, got {table!r:.80}")
    topics: dict[str, TopicConfig] = {}
    for key, entry in table.items():
        cfg = TopicConfig.from_json(key, entry)
        error = topic_config_error(cfg)
        if error is not None:
            raise ConfigFormatError(error)
        topics[key] = cfg
    return topics, _decode_version(doc.get("dataVersion"))


def _decode_version(raw: object) -> DataVersion:
    if raw is None:
        return (0, 0)
    if not isinstance(raw, dict):
        raise ConfigFormatError(f"dataVersion must be an object, got {raw!r:.80}")
    return (
        _typed(raw, "dataVersion", "timestamp", int, 0),
        _typed(raw, "dataVersion", "counter", int, 0),
    )


def _load(path: Path, max_topics: int) -> tuple[dict[str, TopicConfig], DataVersion]:
    doc, _source = load_json_with_fallback(path)
    if doc is None:
        return {}, (0, 0)
    try:
        topics, version = decode_topics(doc)
    except ConfigFormatError as exc:
        raise ConfigFormatError(f"{path}: {exc}") from exc
    if len(topics) > max_topics:
        raise ConfigLimitError(f"{path} holds {len(topics)} topics; the limit is {max_topics}")
    return topics, version


def _check(cfg: TopicConfig) -> None:
    error = topic_config_error(cfg)
    if error is not None:
        raise ValueError(error)


def _attributes(entry: dict[str, object], where: str) -> dict[str, str]:
    raw = entry.get("attributes")
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(type(v) is str for v in raw.values()):
        raise ConfigFormatError(f"{where}: attributes must map names to strings, got {raw!r:.80}")
    return dict(raw)


def _typed(entry: dict[str, object], where: str, name: str, kind: type[_T], default: _T) -> _T:
    value = entry.get(name, default)
    # Exact type too: a JSON true must not pass as the integer 1.
    if not isinstance(value, kind) or type(value) is not kind:
        raise ConfigFormatError(f"{where}: {name} must be {kind.__name__}, got {value!r:.80}")
    return value

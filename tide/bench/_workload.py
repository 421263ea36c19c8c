"""Benchmark workloads: what ``tide bench run`` produces and consumes, read from YAML or TOML.

A workload file is one mapping of the fields of :class:`Workload` (snake case; unknown
fields are an error). Modelled on the OpenMessaging Benchmark's workloads (topics,
partitions per topic, message size, producers and consumers per topic, producer rate,
warm-up and test duration).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

# The first bytes of every body: the send time (ns since epoch, 16 hex digits).
STAMP_BYTES = 16
MAX_MESSAGE_BYTES = 4 << 20
MAX_BATCH = 1024  # the gateway's limit per Produce (tide.client.MAX_BATCH_MESSAGES)
MAX_REQUEST_BYTES = 64 << 20  # a Produce request (batch x size) larger than this is refused
MAX_QUEUES = 1024
MAX_TOPICS = 1000
MAX_CLIENTS = 1000
MAX_INFLIGHT = 256
MAX_PROCESSES = 16  # producer_processes, consumer_processes
MAX_PULL_BATCH = 1024
MAX_LONG_POLL_MS = 30_000
WORKLOAD_SUFFIXES = (".yaml", ".yml", ".toml")
MAX_NAME_CHARS = 80  # topic names are built from it (127 bytes at most)
# How producers send: a Produce call per batch, or the batches on one ProduceStream each.
PRODUCE_APIS = ("unary", "stream")


class WorkloadError(ValueError):
    """A workload file or value that cannot be used (the message names the field)."""


@dataclass(frozen=True)
class Workload:
    """One benchmark workload.

    Every topic gets ``producers_per_topic`` producers, each keeping ``inflight`` Produce
    calls of ``batch_size`` messages in flight (``produce_api: stream``: ``inflight``
    requests on one ProduceStream per producer), and one consumer group of
    ``consumers_per_topic`` consumers that split the topic's queues and long-poll each
    (0: a producer-only run; nothing is consumed and there is no end-to-end latency).
    ``rate`` is the target publish rate of the whole run in messages/s (0: as fast as
    it goes). Nothing is measured for the first ``warmup_s``; then ``duration_s``.
    ``producer_processes`` > 1 runs the producers in that many OS processes (each with
    its share of the producers and of the rate), ``consumer_processes`` > 1 the
    consumers; otherwise they run in the main process.
    """

    name: str
    topics: int = 1
    queues_per_topic: int = 4
    message_size: int = 128
    batch_size: int = 1
    producers_per_topic: int = 1
    inflight: int = 1
    consumers_per_topic: int = 1
    rate: float = 0.0
    warmup_s: float = 5.0
    duration_s: float = 30.0
    pull_batch: int = 256
    # A pull that came back full (the consumer is behind) doubles the next one's
    # max_messages up to this; one that was not goes back to pull_batch. 0: always
    # pull_batch.
    pull_batch_max: int = 0
    long_poll_ms: int = 2_000
    # Each pull's min_messages and min_messages_wait_ms (the gateway holds a pull until its
    # queue has that many past the offset, up to the wait; 0: reads at once).
    pull_min_messages: int = 0
    pull_min_wait_ms: int = 0
    producer_processes: int = 1
    consumer_processes: int = 1
    produce_api: str = "unary"
    description: str = ""

    def __post_init__(self) -> None:
        _check_name(self.name)
        for name, low, high in (
            ("topics", 1, MAX_TOPICS),
            ("queues_per_topic", 1, MAX_QUEUES),
            ("message_size", STAMP_BYTES, MAX_MESSAGE_BYTES),
            ("batch_size", 1, MAX_BATCH),
            ("producers_per_topic", 1, MAX_CLIENTS),
            ("inflight", 1, MAX_INFLIGHT),
            ("consumers_per_topic", 0, MAX_CLIENTS),
            ("pull_batch", 1, MAX_PULL_BATCH),
            ("pull_batch_max", 0, MAX_PULL_BATCH),
            ("long_poll_ms", 1, MAX_LONG_POLL_MS),
            ("pull_min_messages", 0, MAX_PULL_BATCH),
            ("pull_min_wait_ms", 0, MAX_LONG_POLL_MS),
            ("producer_processes", 1, MAX_PROCESSES),
            ("consumer_processes", 1, MAX_PROCESSES),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise WorkloadError(f"{name} is {value!r}; give an integer in {low}..{high}")
            if not low <= value <= high:
                raise WorkloadError(f"{name} is {value}; give {low}..{high}")
        for name in ("rate", "warmup_s", "duration_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise WorkloadError(f"{name} is {value!r}; give a number")
            if not math.isfinite(value) or value < 0:
                raise WorkloadError(f"{name} is {value}; give a finite number >= 0")
        if self.duration_s <= 0:
            raise WorkloadError(f"duration_s is {self.duration_s}; give a positive number")
        if self.batch_size * self.message_size > MAX_REQUEST_BYTES:
            raise WorkloadError(
                f"batch_size x message_size is {self.batch_size * self.message_size} bytes; "
                f"keep a request under {MAX_REQUEST_BYTES}"
            )
        for role, processes, clients in (
            ("producer", self.producer_processes, self.producers),
            ("consumer", self.consumer_processes, self.consumers),
        ):
            if processes > 1 and processes > clients:
                raise WorkloadError(
                    f"{role}_processes is {processes}, more than the {clients} {role}(s) "
                    f"(topics x {role}s_per_topic); every process runs at least one"
                )
        if self.produce_api not in PRODUCE_APIS:
            raise WorkloadError(
                f"produce_api is {self.produce_api!r}; give one of {', '.join(PRODUCE_APIS)}"
            )
        if 0 < self.pull_batch_max < self.pull_batch:
            raise WorkloadError(
                f"pull_batch_max is {self.pull_batch_max}, below pull_batch "
                f"({self.pull_batch}); give 0 (pull_batch always) or {self.pull_batch}.."
                f"{MAX_PULL_BATCH}"
            )
        if self.pull_min_messages > self.pull_batch:
            raise WorkloadError(
                f"pull_min_messages is {self.pull_min_messages}, above pull_batch "
                f"({self.pull_batch}); give 0..{self.pull_batch}"
            )
        if not isinstance(self.description, str):
            raise WorkloadError(f"description is {self.description!r}; give a string")

    @property
    def producers(self) -> int:
        return self.topics * self.producers_per_topic

    @property
    def consumers(self) -> int:
        return self.topics * self.consumers_per_topic

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> Workload:
        return dataclasses.replace(self, **changes)

    def summary(self) -> str:
        rate = "as fast as possible" if self.rate == 0 else f"{self.rate:,.0f} msgs/s"
        producer_processes = _in_processes(self.producer_processes)
        consumer_processes = _in_processes(self.consumer_processes)
        return (
            f"{self.topics} topic(s) x {self.queues_per_topic} queues per broker, "
            f"{self.message_size} B, batches of {self.batch_size}, "
            f"{self.producers_per_topic} producer(s) x {self.inflight} in flight"
            f"{' on a ProduceStream' if self.produce_api == 'stream' else ''}"
            f"{producer_processes} and {self.consumers_per_topic} consumer(s) per topic"
            f"{consumer_processes}, {rate}, "
            f"warm-up {self.warmup_s:g} s, {self.duration_s:g} s"
        )


def _in_processes(count: int) -> str:
    return f" in {count} processes" if count > 1 else ""


_FIELD_TYPES: dict[str, type] = {
    "name": str,
    "description": str,
    "produce_api": str,
    "rate": float,
    "warmup_s": float,
    "duration_s": float,
}


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise WorkloadError(f"name is {name!r}; give a non-empty string")
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
    if len(name) > MAX_NAME_CHARS or not set(name) <= allowed:
        raise WorkloadError(
            f"name is {name!r}; use at most {MAX_NAME_CHARS} letters, digits, '-' and '_'"
        )


def field_names() -> list[str]:
    return [field.name for field in fields(Workload)]


def workload_from_mapping(data: Mapping[str, Any], default_name: str = "") -> Workload:
    """A :class:`Workload` from a parsed file; numbers given as integers are accepted for
    the float fields (``rate: 5000``)."""
    if not isinstance(data, Mapping):
        raise WorkloadError(f"a workload is a mapping of fields, not {type(data).__name__}")
    known = set(field_names())
    if unknown := sorted(str(key) for key in data if key not in known):
        raise WorkloadError(
            f"unknown field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    values = dict(data)
    values.setdefault("name", default_name)
    for name, kind in _FIELD_TYPES.items():
        value = values.get(name)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            values[name] = float(value)
    return Workload(**values)


def parse_workload(text: str, suffix: str, default_name: str = "") -> Workload:
    """A workload from the text of a ``.yaml``/``.yml`` or ``.toml`` file."""
    if suffix == ".toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise WorkloadError(f"not valid TOML: {exc}") from None
    elif suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise WorkloadError(f"not valid YAML: {exc}") from None
    else:
        raise WorkloadError(f"unknown workload format {suffix!r}; use .yaml, .yml or .toml")
    return workload_from_mapping(data if data is not None else {}, default_name)


def find_workload(spec: str, search: Path | None = None) -> Path:
    """The file for ``spec``: a path, or the name of a workload in ``search``
    (default ``bench/workloads`` under the working directory), with or without suffix."""
    path = Path(spec)
    if path.is_file():
        return path
    directory = search if search is not None else Path("bench") / "workloads"
    for suffix in ("", *WORKLOAD_SUFFIXES):
        candidate = directory / f"{spec}{suffix}"
        if candidate.is_file():
            return candidate
    raise WorkloadError(f"no workload file {spec!r} (nor {spec} in {directory}/)")


def load_workload(spec: str, search: Path | None = None) -> Workload:
    """Find (see :func:`find_workload`), read and validate a workload file; its name
    defaults to the file name without suffix."""
    path = find_workload(spec, search)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read {path}: {exc}") from None
    try:
        return parse_workload(text, path.suffix.lower(), default_name=path.stem)
    except WorkloadError as exc:
        raise WorkloadError(f"{path}: {exc}") from None


def apply_overrides(workload: Workload, assignments: list[str]) -> Workload:
    """``FIELD=VALUE`` assignments (``--set duration_s=2``), converted to the field's type."""
    changes: dict[str, Any] = {}
    known = {field.name: field for field in fields(Workload)}
    for assignment in assignments:
        name, sep, text = assignment.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise WorkloadError(
                f"--set {assignment!r}: give FIELD=VALUE, FIELD one of {', '.join(known)}"
            )
        kind = _FIELD_TYPES.get(name, int)
        try:
            changes[name] = kind(text.strip())
        except ValueError:
            raise WorkloadError(
                f"--set {assignment!r}: {text!r} is not a {kind.__name__}"
            ) from None
    return workload.replace(**changes) if changes else workload

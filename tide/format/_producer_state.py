"""Idempotent producers: the record properties and the producer-state snapshot.

A record an idempotent producer wrote carries ``__PID`` (the producer id), ``__PSEQ``
(``first-last``, the sequences of the batch it was appended in: the same on every record
of that batch, the records of one batch being contiguous in the commitlog) and, when not
0, ``__PEPOCH`` (the producer's epoch; docs/formats.md "Idempotent producers"). The
storage rebuilds its duplicate window from them after the snapshot's offset.

The snapshot ``config/producerState.json`` (JSON, written atomically) holds the window
as of ``commitlogOffset``: per producer its last append time and, per queue, its last
batches with their original results.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRODUCER_ID = "__PID"
PRODUCER_SEQ = "__PSEQ"
PRODUCER_EPOCH = "__PEPOCH"  # only when the epoch is not 0
PRODUCER_STATE_FILE = "producerState.json"
PRODUCER_STATE_VERSION = 1
PRODUCER_ID_MAX_CHARS = 64
# A producer id: letters, digits and "-_.:" (it is a property value and a JSON key).
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


class ProducerStateError(ValueError):
    """A snapshot or a property that is not in the layout."""


def producer_id_error(producer_id: str) -> str | None:
    """Why ``producer_id`` is not one, or None."""
    if not producer_id:
        return "the producer id is empty"
    if len(producer_id) > PRODUCER_ID_MAX_CHARS:
        return f"the producer id is longer than PRODUCER_ID_MAX_CHARS ({PRODUCER_ID_MAX_CHARS})"
    if not set(producer_id) <= _ID_CHARS:
        return "the producer id may hold only letters, digits and - _ . :"
    return None


def format_sequences(first: int, last: int) -> str:
    return f"{first}-{last}"


def parse_sequences(value: str) -> tuple[int, int]:
    first, sep, last = value.partition("-")
    if not sep or not first.isdigit() or not last.isdigit():
        raise ProducerStateError(f"{PRODUCER_SEQ} {value[:40]!r} is not FIRST-LAST")
    low, high = int(first), int(last)
    if high < low:
        raise ProducerStateError(f"{PRODUCER_SEQ} {value[:40]!r}: LAST is below FIRST")
    return low, high


@dataclass(slots=True)
class BatchEntry:
    """One stored batch and its original result."""

    first_seq: int
    last_seq: int
    store_timestamp_ms: int
    physical_offsets: list[int]
    queue_offsets: list[int]
    sizes: list[int]

    def to_json(self) -> dict[str, object]:
        return {
            "firstSeq": self.first_seq,
            "lastSeq": self.last_seq,
            "storeTimestampMs": self.store_timestamp_ms,
            "physicalOffsets": self.physical_offsets,
            "queueOffsets": self.queue_offsets,
            "sizes": self.sizes,
        }

    @classmethod
    def from_json(cls, raw: object) -> BatchEntry:
        if not isinstance(raw, dict):
            raise ProducerStateError("a batch is not an object")
        try:
            entry = cls(
                _int(raw["firstSeq"]),
                _int(raw["lastSeq"]),
                _int(raw["storeTimestampMs"]),
                [_int(x) for x in _list(raw["physicalOffsets"])],
                [_int(x) for x in _list(raw["queueOffsets"])],
                [_int(x) for x in _list(raw["sizes"])],
            )
        except KeyError as exc:
            raise ProducerStateError(f"a batch has no {exc.args[0]}") from None
        count = entry.last_seq - entry.first_seq + 1
        if (
            count < 1
            or not len(entry.physical_offsets)
            == len(entry.queue_offsets)
            == len(entry.sizes)
            == count
        ):
            raise ProducerStateError(f"batch {entry.first_seq}-{entry.last_seq}: columns differ")
        return entry


@dataclass(slots=True)
class ProducerEntry:
    last_append_ms: int
    # (topic, queue id) -> the last batches, oldest first.
    queues: dict[tuple[str, int], list[BatchEntry]] = field(default_factory=dict)
    # A newer epoch starts every queue's sequences again; an older one is fenced.
    epoch: int = 0


@dataclass(slots=True)
class ProducerStateSnapshot:
    commitlog_offset: int
    producers: dict[str, ProducerEntry]


def encode_producer_state(snapshot: ProducerStateSnapshot) -> dict[str, object]:
    producers: dict[str, object] = {}
    for pid, entry in snapshot.producers.items():
        producers[pid] = {
            "lastAppendMs": entry.last_append_ms,
            "epoch": entry.epoch,
            "queues": [
                {"topic": t, "queueId": q, "batches": [b.to_json() for b in batches]}
                for (t, q), batches in entry.queues.items()
            ],
        }
    return {
        "version": PRODUCER_STATE_VERSION,
        "commitlogOffset": snapshot.commitlog_offset,
        "producers": producers,
    }


def decode_producer_state(raw: object) -> ProducerStateSnapshot:
    """The snapshot from its parsed JSON; ProducerStateError naming what is wrong."""
    if not isinstance(raw, dict):
        raise ProducerStateError(f"{PRODUCER_STATE_FILE} is not a JSON object")
    if raw.get("version") != PRODUCER_STATE_VERSION:
        raise ProducerStateError(f"{PRODUCER_STATE_FILE}: version is not {PRODUCER_STATE_VERSION}")
    producers_raw = raw.get("producers")
    if not isinstance(producers_raw, dict):
        raise ProducerStateError(f"{PRODUCER_STATE_FILE}: producers is not an object")
    producers: dict[str, ProducerEntry] = {}
    for pid, entry_raw in producers_raw.items():
        if producer_id_error(pid) is not None or not isinstance(entry_raw, dict):
            raise ProducerStateError(f"{PRODUCER_STATE_FILE}: bad producer {pid[:80]!r}")
        entry = ProducerEntry(
            _int(entry_raw.get("lastAppendMs")), epoch=_int(entry_raw.get("epoch", 0))
        )
        for queue_raw in _list(entry_raw.get("queues")):
            if not isinstance(queue_raw, dict) or not isinstance(queue_raw.get("topic"), str):
                raise ProducerStateError(f"{PRODUCER_STATE_FILE}: bad queue of {pid!r}")
            key = (str(queue_raw["topic"]), _int(queue_raw.get("queueId")))
            entry.queues[key] = [BatchEntry.from_json(b) for b in _list(queue_raw.get("batches"))]
        producers[pid] = entry
    return ProducerStateSnapshot(_int(raw.get("commitlogOffset")), producers)


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProducerStateError(f"{str(value)[:40]!r} is not a non-negative integer")
    return value


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise ProducerStateError(f"{str(value)[:40]!r} is not a list")
    return value

"""POP checkpoints (issue 20): what a Receive handed out, as a revive log record.

docs/formats.md, "POP layouts". A Receive writes one checkpoint record per message it
hands out to ``rmq_sys_REVIVE_LOG`` queue 0 (tag ``ck``) BEFORE it answers, all of one
call in one Append (RocketMQ's PopCheckPoint, one per message here: a checkpoint is then
resolved by one ack, and ChangeInvisibleDuration moves one message). Its body is compact
JSON (RocketMQ's checkpoint is JSON too):

    {"g": group, "t": topic read, "q": queue id, "o": queue offset,
     "p": commitlog offset, "s": record size, "a": delivery attempt,
     "d": invisible until (ms since epoch), "f": 1 when delivered in FIFO order,
     "ot": the topic the consumer asked for}

``t`` is the consumer's topic or the group's POP retry topic ``%RETRY%<group>_<topic>``;
``ot`` is always the consumer's topic. A checkpoint is named by its revive queue offset
(the receipt handle carries it).

A Receive writes its checkpoints as *checkpoint runs* instead (tag ``cks``): one record
holds up to CHECKPOINT_RUN_MAX_COUNT checkpoints of the call (RocketMQ's PopCheckPoint
also covers a whole pop), so a Receive of 32 writes, dispatches and reads back at
recovery one revive log record instead of 32. Their shared fields are stated once:

    {"g": group, "d": invisible until, "f": 0 or 1, "ot": the consumer's topic,
     "t": [topics read], "l": [[index into t, queue id, queue offset, commitlog offset,
                                record size, delivery attempt], ...]}

The ``i``-th checkpoint of the run at revive queue offset ``R`` is named
``run_checkpoint_id(R, i)`` = RUN_ID_FLAG | R << 8 | i: an integer, as a single
checkpoint's name, that no revive offset can be (RUN_ID_FLAG is bit 62), so receipt
handles, acks and the held map name both kinds alike and a log written before runs
existed recovers unchanged. ``revive_offset_of`` gives back the revive offset a name
was written at (the revive progress is kept in revive offsets).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CHECKPOINT_TAG = "ck"
# Properties of a message delivered again through the POP retry topic: the queue and
# offset it was first received from (its topic and msg id: RETRY_TOPIC, ORIGIN_MESSAGE_ID).
POP_ORIGIN_QUEUE_ID = "POP_ORIGIN_QID"
POP_ORIGIN_QUEUE_OFFSET = "POP_ORIGIN_OFFSET"
MAX_CHECKPOINT_BODY_BYTES = 2_048  # group and topics at their longest fit with room

CHECKPOINTS_TAG = "cks"  # a checkpoint run
CHECKPOINT_RUN_MAX_COUNT = 256  # checkpoints in one run record (the index's 8 bits)
# A run's body: every checkpoint at its longest (a whole checkpoint's bound each).
MAX_CHECKPOINT_RUN_BODY_BYTES = CHECKPOINT_RUN_MAX_COUNT * MAX_CHECKPOINT_BODY_BYTES
RUN_ID_FLAG = 1 << 62  # above every revive offset (a commitlog of 2^54 records at most)
_RUN_INDEX_BITS = 8


class PopRecordError(ValueError):
    """A revive log body that is not a checkpoint or ack of this layout (torn, corrupt
    or foreign): the revive service logs and skips it."""


@dataclass(frozen=True, slots=True)
class PopCheckpoint:
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    attempt: int
    invisible_until_ms: int
    fifo: bool
    origin_topic: str


def encode_checkpoint(ck: PopCheckpoint) -> bytes:
    document = {
        "g": ck.group,
        "t": ck.topic,
        "q": ck.queue_id,
        "o": ck.queue_offset,
        "p": ck.physical_offset,
        "s": ck.size,
        "a": ck.attempt,
        "d": ck.invisible_until_ms,
        "f": 1 if ck.fifo else 0,
        "ot": ck.origin_topic,
    }
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


def decode_checkpoint(body: bytes) -> PopCheckpoint:
    """PopRecordError when ``body`` is not a whole checkpoint of this layout."""
    document = _json_object(body, "checkpoint")
    try:
        ck = PopCheckpoint(
            group=_text(document, "g"),
            topic=_text(document, "t"),
            queue_id=_number(document, "q"),
            queue_offset=_number(document, "o"),
            physical_offset=_number(document, "p"),
            size=_number(document, "s"),
            attempt=_number(document, "a"),
            invisible_until_ms=_number(document, "d"),
            fifo=_number(document, "f") == 1,
            origin_topic=_text(document, "ot"),
        )
    except KeyError as exc:
        raise PopRecordError(f"checkpoint lacks field {exc}") from None
    if ck.size <= 0 or ck.attempt <= 0:
        raise PopRecordError(f"checkpoint has size {ck.size}, attempt {ck.attempt}")
    return ck


def _json_object(
    body: bytes, what: str, max_bytes: int = MAX_CHECKPOINT_BODY_BYTES
) -> dict[str, Any]:
    if len(body) > max_bytes:
        raise PopRecordError(f"{what} body is {len(body)} bytes (at most {max_bytes})")
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PopRecordError(f"{what} body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise PopRecordError(f"{what} body is not a JSON object")
    return document


def _text(document: dict[str, Any], name: str) -> str:
    value = document[name]
    if not isinstance(value, str) or not value:
        raise PopRecordError(f"field {name!r} is not a non-empty string")
    return value


def _number(document: dict[str, Any], name: str) -> int:
    value = document[name]
    if type(value) is not int or value < 0:
        raise PopRecordError(f"field {name!r} is not an integer >= 0")
    return value


def run_checkpoint_id(revive_offset: int, index: int) -> int:
    """The name of the ``index``-th checkpoint of the run at ``revive_offset``."""
    if not 0 <= index < CHECKPOINT_RUN_MAX_COUNT:
        raise ValueError(f"index {index} is not in 0..{CHECKPOINT_RUN_MAX_COUNT - 1}")
    return RUN_ID_FLAG | revive_offset << _RUN_INDEX_BITS | index


def revive_offset_of(checkpoint_id: int) -> int:
    """The revive queue offset of the record that holds checkpoint ``checkpoint_id``."""
    if checkpoint_id & RUN_ID_FLAG:
        return (checkpoint_id & ~RUN_ID_FLAG) >> _RUN_INDEX_BITS
    return checkpoint_id


def encode_checkpoints(cks: Sequence[PopCheckpoint]) -> bytes:
    """One run's body. ValueError unless 1..CHECKPOINT_RUN_MAX_COUNT checkpoints that
    share group, invisible time, FIFO flag and consumer topic (those of one Receive)."""
    if not 1 <= len(cks) <= CHECKPOINT_RUN_MAX_COUNT:
        raise ValueError(f"a checkpoint run holds 1..{CHECKPOINT_RUN_MAX_COUNT} checkpoints")
    first = cks[0]
    shared = (first.group, first.invisible_until_ms, first.fifo, first.origin_topic)
    topics: dict[str, int] = {}
    rows: list[list[int]] = []
    for ck in cks:
        if (ck.group, ck.invisible_until_ms, ck.fifo, ck.origin_topic) != shared:
            raise ValueError("a checkpoint run's checkpoints are of one Receive")
        topic_index = topics.setdefault(ck.topic, len(topics))
        rows.append(
            [topic_index, ck.queue_id, ck.queue_offset, ck.physical_offset, ck.size, ck.attempt]
        )
    document = {
        "g": first.group,
        "d": first.invisible_until_ms,
        "f": 1 if first.fifo else 0,
        "ot": first.origin_topic,
        "t": list(topics),
        "l": rows,
    }
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


def decode_checkpoints(body: bytes) -> list[PopCheckpoint]:
    """PopRecordError when ``body`` is not a whole checkpoint run of this layout."""
    document = _json_object(body, "checkpoint run", MAX_CHECKPOINT_RUN_BODY_BYTES)
    try:
        group, origin = _text(document, "g"), _text(document, "ot")
        until, fifo = _number(document, "d"), _number(document, "f") == 1
        topics, rows = document["t"], document["l"]
    except KeyError as exc:
        raise PopRecordError(f"checkpoint run lacks field {exc}") from None
    if not isinstance(topics, list) or not all(isinstance(t, str) and t for t in topics):
        raise PopRecordError("checkpoint run field 't' is not a list of topic names")
    if not isinstance(rows, list) or not 1 <= len(rows) <= CHECKPOINT_RUN_MAX_COUNT:
        raise PopRecordError(
            f"checkpoint run field 'l' is not a list of 1..{CHECKPOINT_RUN_MAX_COUNT} rows"
        )
    return [_row(row, topics, group, until, fifo, origin) for row in rows]


def _row(
    row: object, topics: list[str], group: str, until: int, fifo: bool, origin: str
) -> PopCheckpoint:
    if (
        not isinstance(row, list)
        or len(row) != 6
        or not all(type(v) is int and v >= 0 for v in row)
        or row[0] >= len(topics)
        or row[4] <= 0
        or row[5] <= 0
    ):
        raise PopRecordError(
            "checkpoint run row is not [topic index, queue id, queue offset, commitlog "
            "offset, size > 0, attempt > 0]"
        )
    topic_index, queue_id, queue_offset, physical_offset, size, attempt = row
    return PopCheckpoint(
        group=group,
        topic=topics[topic_index],
        queue_id=queue_id,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        size=size,
        attempt=attempt,
        invisible_until_ms=until,
        fifo=fifo,
        origin_topic=origin,
    )

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
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

CHECKPOINT_TAG = "ck"
# Properties of a message delivered again through the POP retry topic: the queue and
# offset it was first received from (its topic and msg id: RETRY_TOPIC, ORIGIN_MESSAGE_ID).
POP_ORIGIN_QUEUE_ID = "POP_ORIGIN_QID"
POP_ORIGIN_QUEUE_OFFSET = "POP_ORIGIN_OFFSET"
MAX_CHECKPOINT_BODY_BYTES = 2_048  # group and topics at their longest fit with room


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


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    if len(body) > MAX_CHECKPOINT_BODY_BYTES:
        raise PopRecordError(
            f"{what} body is {len(body)} bytes (at most {MAX_CHECKPOINT_BODY_BYTES})"
        )
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

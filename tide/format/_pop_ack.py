"""POP acks (issue 20): a checkpoint resolved, as a revive log record.

docs/formats.md, "POP layouts". An ack record (``rmq_sys_REVIVE_LOG`` queue 0, tag
``ack``; RocketMQ's AckMsg) resolves the checkpoint at revive queue offset ``c``; ``r``
says how: ``ack`` (the consumer acked it, or its tag did not match and it was never
handed out), ``revive`` (its invisible time passed and it was re-put into the retry
topic, written in the same Append as the re-put), ``dlq`` (stored in %DLQ%<group>, in the
same Append), ``change`` (ChangeInvisibleDuration: a new checkpoint, in the same Append).

    {"c": checkpoint revive offset, "r": reason}
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tide.format._pop_checkpoint import PopRecordError, _json_object, _number

ACK_TAG = "ack"
ACK_REASON_ACK = "ack"
ACK_REASON_REVIVE = "revive"
ACK_REASON_DLQ = "dlq"
ACK_REASON_CHANGE = "change"
ACK_REASONS = frozenset({ACK_REASON_ACK, ACK_REASON_REVIVE, ACK_REASON_DLQ, ACK_REASON_CHANGE})


@dataclass(frozen=True, slots=True)
class PopAck:
    checkpoint_offset: int
    reason: str


def encode_ack(ack: PopAck) -> bytes:
    document = {"c": ack.checkpoint_offset, "r": ack.reason}
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


def decode_ack(body: bytes) -> PopAck:
    """PopRecordError when ``body`` is not a whole ack of this layout."""
    document = _json_object(body, "ack")
    try:
        offset = _number(document, "c")
        reason = document["r"]
    except KeyError as exc:
        raise PopRecordError(f"ack lacks field {exc}") from None
    if reason not in ACK_REASONS:
        raise PopRecordError(f"ack reason {reason!r} is not one of {sorted(ACK_REASONS)}")
    return PopAck(offset, reason)

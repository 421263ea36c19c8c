"""Receipt handles (issue 20): what names one POP delivery to Ack,
ChangeInvisibleDuration and ForwardToDeadLetter (RocketMQ's ReceiptHandle, ExtraInfoUtil).

docs/formats.md, "POP layouts". Text, fields joined by ``.`` (no topic, group or broker
name holds one):

    P1.<checkpoint>.<queue id>.<queue offset>.<invisible until ms>.<retry>.<broker>.<check>

``checkpoint`` is the checkpoint's revive queue offset, ``broker`` the broker name.

``retry`` is 1 when the message was read from the group's POP retry topic; ``check`` is
the CRC-32 of everything before it, 8 hex digits, so a garbled handle is told from one
that names a checkpoint no longer held. The gateway builds and reads handles; the broker
checks the checkpoint's group, topic and queue position against them.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

HANDLE_VERSION = "P1"
_SEPARATOR = "."
_FIELDS = 8


class ReceiptHandleError(ValueError):
    """Not a receipt handle of this layout (garbled, truncated, foreign)."""


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    checkpoint_offset: int
    queue_id: int
    queue_offset: int
    invisible_until_ms: int
    retry: bool
    broker_name: str


def encode_handle(handle: ReceiptHandle) -> str:
    head = _SEPARATOR.join(
        (
            HANDLE_VERSION,
            str(handle.checkpoint_offset),
            str(handle.queue_id),
            str(handle.queue_offset),
            str(handle.invisible_until_ms),
            "1" if handle.retry else "0",
            handle.broker_name,
        )
    )
    return f"{head}{_SEPARATOR}{_check(head)}"


def decode_handle(text: str) -> ReceiptHandle:
    """ReceiptHandleError when ``text`` is not a whole handle of this layout."""
    parts = text.split(_SEPARATOR)
    if len(parts) != _FIELDS or parts[0] != HANDLE_VERSION:
        raise ReceiptHandleError(f"not a receipt handle ({HANDLE_VERSION}.… with {_FIELDS} fields)")
    head = text[: text.rfind(_SEPARATOR)]
    if parts[-1] != _check(head):
        raise ReceiptHandleError("receipt handle is garbled (its check digits do not match)")
    numbers = parts[1:5]
    if not all(part.isdigit() and part.isascii() for part in numbers) or parts[5] not in ("0", "1"):
        raise ReceiptHandleError("receipt handle has a field that is not a number")
    if not parts[6]:
        raise ReceiptHandleError("receipt handle names no broker")
    ck, queue_id, queue_offset, until = (int(part) for part in numbers)
    return ReceiptHandle(ck, queue_id, queue_offset, until, parts[5] == "1", parts[6])


def _check(head: str) -> str:
    return f"{zlib.crc32(head.encode('utf-8')):08x}"

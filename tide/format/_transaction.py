"""Transactional messages (issue 19): the half and op records' properties and bodies.

docs/formats.md, "Transactional messages". A half message is the producer's message
stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 with sys_flag TRANSACTION_PREPARED and,
after the user's properties, ``REAL_TOPIC``, ``REAL_QID``, ``TRAN_MSG=true``, ``PGROUP``
and ``TRANSACTION_ID``. An op record (``RMQ_SYS_TRANS_OP_HALF_TOPIC`` queue 0, tag ``d``
as RocketMQ's REMOVETAG) resolves one half: its body is the half's queue offset in ASCII
decimal (RocketMQ's body), its ``TRAN_RESOLUTION`` property says how (``commit``,
``rollback`` or ``discard`` after the last check).
"""

from __future__ import annotations

from collections.abc import Mapping

from tide.format._properties import (
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TRAN_MSG,
    TRANSACTION_ID,
    encode_properties,
)
from tide.format._system_topics import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC

TRAN_RESOLUTION = "TRAN_RESOLUTION"
OP_TAG = "d"
HALF_QUEUE_ID = 0
OP_QUEUE_ID = 0
RESOLUTION_COMMIT = "commit"
RESOLUTION_ROLLBACK = "rollback"
RESOLUTION_DISCARD = "discard"
RESOLUTIONS = frozenset({RESOLUTION_COMMIT, RESOLUTION_ROLLBACK, RESOLUTION_DISCARD})
# What a half carries beyond the producer's message: removed again from the committed copy.
HALF_BOOKKEEPING = frozenset({REAL_TOPIC, REAL_QID, TRAN_RESOLUTION})

__all__ = [
    "HALF_BOOKKEEPING",
    "HALF_QUEUE_ID",
    "OP_QUEUE_ID",
    "OP_TAG",
    "RESOLUTIONS",
    "RESOLUTION_COMMIT",
    "RESOLUTION_DISCARD",
    "RESOLUTION_ROLLBACK",
    "TRANSACTION_CHECKS_FILE",
    "TRANS_HALF_TOPIC",
    "TRANS_OP_HALF_TOPIC",
    "TRAN_RESOLUTION",
    "committed_properties",
    "decode_transaction_checks",
    "encode_transaction_checks",
    "half_properties",
    "op_body",
    "op_properties",
    "parse_op_body",
]


def half_properties(
    properties: Mapping[str, str],
    real_topic: str,
    real_queue_id: int,
    producer_group: str,
    transaction_id: str,
) -> dict[str, str]:
    """The stored properties of a half message: the producer's (in their order) then the
    transaction's bookkeeping (any the input carries is replaced)."""
    result = {
        name: value
        for name, value in properties.items()
        if name not in HALF_BOOKKEEPING and name not in (TRAN_MSG, PGROUP, TRANSACTION_ID)
    }
    result[REAL_TOPIC] = real_topic
    result[REAL_QID] = str(real_queue_id)
    result[TRAN_MSG] = "true"
    result[PGROUP] = producer_group
    result[TRANSACTION_ID] = transaction_id
    return result


def committed_properties(half: Mapping[str, str]) -> dict[str, str]:
    """The committed copy's properties: the half's without REAL_TOPIC / REAL_QID (TRAN_MSG,
    PGROUP and the transaction id stay, as RocketMQ keeps them; UNIQ_KEY stays)."""
    return {name: value for name, value in half.items() if name not in HALF_BOOKKEEPING}


def op_body(half_queue_offset: int) -> bytes:
    return str(half_queue_offset).encode("ascii")


def op_properties(resolution: str) -> bytes:
    assert resolution in RESOLUTIONS, resolution
    return encode_properties({TAGS: OP_TAG, TRAN_RESOLUTION: resolution})


def parse_op_body(body: bytes) -> int:
    """The half queue offset an op record resolves; ValueError for another body."""
    text = body.decode("ascii", errors="replace")
    if not (text.isascii() and text.isdigit() and len(text) <= 19):
        raise ValueError(f"an op record's body must be a queue offset, got {text[:40]!r}")
    return int(text)


TRANSACTION_CHECKS_FILE = "transactionChecks.json"
"""In the dispatch's ``<store_dir>/config``: the check count of each half checked."""


def encode_transaction_checks(checks: Mapping[int, int]) -> dict[str, object]:
    """``{"version": 1, "checks": {"<half queue offset>": <checks>}}``."""
    return {
        "version": 1,
        "checks": {str(offset): count for offset, count in sorted(checks.items())},
    }


def decode_transaction_checks(document: object) -> dict[int, int]:
    """The checks of :func:`encode_transaction_checks`' document; ValueError otherwise."""
    if not isinstance(document, dict) or document.get("version") != 1:
        raise ValueError("a transaction checks file must be an object with version 1")
    checks = document.get("checks")
    if not isinstance(checks, dict):
        raise ValueError("a transaction checks file must have a checks object")
    result: dict[int, int] = {}
    for key, value in checks.items():
        if not (isinstance(key, str) and key.isdigit() and isinstance(value, int) and value >= 0):
            raise ValueError(f"a transaction check entry must be offset: count, got {key!r}")
        result[int(key)] = value
    return result

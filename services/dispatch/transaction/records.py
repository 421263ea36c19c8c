"""The records a resolution writes: the committed copy of a half and its op record
(docs/formats.md, "Transactional messages")."""

from __future__ import annotations

from tide.format import (
    OP_QUEUE_ID,
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_PRODUCER_MASK,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    TRANS_OP_HALF_TOPIC,
    DecodedRecord,
    committed_properties,
    encode_properties,
    encode_record,
    op_body,
    op_properties,
    pack_host,
    real_destination,
)

_OP_TOPIC_BYTES = TRANS_OP_HALF_TOPIC.encode("utf-8")
# A run's record keeps the producer's sys_flag bits only (SYSFLAG_PRODUCER_MASK: the store
# refuses others); the born host bit is set from the host's length.
_NO_STORE_HOST = bytes(8)  # the store writes its own


def _born(record: DecodedRecord, sys_flag: int) -> tuple[bytes, int]:
    born_host = pack_host(record.born_host)
    sys_flag &= SYSFLAG_PRODUCER_MASK & ~SYSFLAG_BORN_HOST_V6
    if len(born_host) != 8:
        sys_flag |= SYSFLAG_BORN_HOST_V6
    return born_host, sys_flag


def commit_copy(half: DecodedRecord, half_physical_offset: int) -> bytes:
    """The real message of a committed half, as a run record: its real topic and queue,
    REAL_* removed (UNIQ_KEY, TRAN_MSG, PGROUP and the transaction id kept), sys_flag
    COMMIT, the half's commitlog offset as prepared transaction offset (RocketMQ's
    endMessageTransaction). ValueError when the half has no real destination."""
    topic, queue_id, _ = real_destination(half.topic, half.queue_id, half.properties)
    born_host, sys_flag = _born(
        half, (half.sys_flag & ~SYSFLAG_TRANSACTION_MASK) | SYSFLAG_TRANSACTION_COMMIT
    )
    return encode_record(
        topic,
        topic.encode("utf-8"),
        queue_id,
        half.body,
        encode_properties(committed_properties(half.properties)),
        half.flag,
        sys_flag,
        half.born_timestamp_ms,
        born_host,
        _NO_STORE_HOST,
        half.reconsume_times,
        half_physical_offset,
    ).data


def op_record(half: DecodedRecord, half_queue_offset: int, resolution: str) -> bytes:
    """The op record resolving the half at ``half_queue_offset``, as a run record."""
    born_host, sys_flag = _born(half, 0)
    return encode_record(
        TRANS_OP_HALF_TOPIC,
        _OP_TOPIC_BYTES,
        OP_QUEUE_ID,
        op_body(half_queue_offset),
        op_properties(resolution),
        0,
        sys_flag,
        half.born_timestamp_ms,
        born_host,
        _NO_STORE_HOST,
        0,
        0,
    ).data

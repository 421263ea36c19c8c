"""The records POP writes through the storage's Append (docs/formats.md, "POP layouts"):
checkpoints and acks in the revive log, and the copies a revive or a dead-lettering
stores (the retry topic's, %DLQ%<group>'s)."""

from __future__ import annotations

from collections.abc import Sequence

from tide.format import (
    ACK_TAG,
    CHECKPOINT_RUN_MAX_COUNT,
    CHECKPOINT_TAG,
    CHECKPOINTS_TAG,
    DLQ_ORIGIN_MESSAGE_ID,
    DLQ_ORIGIN_TOPIC,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    POP_ORIGIN_QUEUE_ID,
    POP_ORIGIN_QUEUE_OFFSET,
    RECONSUME_TIME,
    RETRY_TOPIC,
    REVIVE_QUEUE_ID,
    REVIVE_TOPIC,
    SCHEDULE_BOOKKEEPING,
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_PRODUCER_MASK,
    TAGS,
    PopAck,
    PopCheckpoint,
    encode_ack,
    encode_checkpoint,
    encode_checkpoints,
    encode_properties,
    encode_record,
    pack_host,
    parse_host,
    run_checkpoint_id,
)
from tide.v1 import storage_pb2 as storage_pb

# The revive that re-put a copy: the checkpoint's revive offset (the copy's source, so a
# copy is told from a second one after a crash; docs/pop.md).
POP_CHECKPOINT = "POP_CK"
_REVIVE_TOPIC_BYTES = REVIVE_TOPIC.encode("utf-8")
_NO_HOST = bytes(8)  # the store writes its own store host
_LOCAL_BORN = pack_host(parse_host("127.0.0.1:0"))


def checkpoint_record(ck: PopCheckpoint, now_ms: int) -> bytes:
    return _revive_record(encode_checkpoint(ck), CHECKPOINT_TAG, now_ms)


def checkpoint_runs(cks: list[PopCheckpoint], now_ms: int) -> list[bytes]:
    """A Receive's checkpoints as checkpoint run records (CHECKPOINT_RUN_MAX_COUNT a
    record): one revive log record a Receive in the common case, not one a message."""
    return [
        _revive_record(
            encode_checkpoints(cks[i : i + CHECKPOINT_RUN_MAX_COUNT]), CHECKPOINTS_TAG, now_ms
        )
        for i in range(0, len(cks), CHECKPOINT_RUN_MAX_COUNT)
    ]


def checkpoint_run_ids(run_offsets: Sequence[int], count: int) -> list[int]:
    """The names of the ``count`` checkpoints :func:`checkpoint_runs` wrote, given each
    run record's revive queue offset: the i-th is entry i % CHECKPOINT_RUN_MAX_COUNT of
    run i // CHECKPOINT_RUN_MAX_COUNT."""
    runs = -(-count // CHECKPOINT_RUN_MAX_COUNT)
    assert len(run_offsets) == runs, (len(run_offsets), runs)
    return [
        run_checkpoint_id(run_offsets[i // CHECKPOINT_RUN_MAX_COUNT], i % CHECKPOINT_RUN_MAX_COUNT)
        for i in range(count)
    ]


def ack_record(ack: PopAck, now_ms: int) -> bytes:
    return _revive_record(encode_ack(ack), ACK_TAG, now_ms)


# The revive log records' properties: their tag only (encoded once, not per record: two
# records a message are written, bench/pop_consume.py).
_REVIVE_PROPERTIES = {
    tag: encode_properties({TAGS: tag}) for tag in (CHECKPOINT_TAG, CHECKPOINTS_TAG, ACK_TAG)
}


def _revive_record(body: bytes, tag: str, now_ms: int) -> bytes:
    properties = _REVIVE_PROPERTIES[tag]
    return encode_record(
        REVIVE_TOPIC,
        _REVIVE_TOPIC_BYTES,
        REVIVE_QUEUE_ID,
        body,
        properties,
        0,
        0,
        now_ms,
        _LOCAL_BORN,
        _NO_HOST,
    ).data


def retry_copy(
    stored: storage_pb.StoredMessage, retry_topic: str, max_times: int, ck_offset: int
) -> bytes:
    """The message again, in the group's POP retry topic queue 0: reconsume times + 1,
    the first attempt's topic and msg id kept (RETRY_TOPIC, ORIGIN_MESSAGE_ID)."""
    properties = _first_attempt(stored)
    properties[RECONSUME_TIME] = str(stored.reconsume_times + 1)
    properties[MAX_RECONSUME_TIMES] = str(max_times)
    properties[POP_CHECKPOINT] = str(ck_offset)
    return _copy(stored, retry_topic, properties, stored.reconsume_times + 1)


def dead_letter_copy(stored: storage_pb.StoredMessage, dlq_topic: str, max_times: int) -> bytes:
    properties = _first_attempt(stored)
    properties[DLQ_ORIGIN_TOPIC] = properties[RETRY_TOPIC]
    properties[DLQ_ORIGIN_MESSAGE_ID] = properties[ORIGIN_MESSAGE_ID]
    properties[RECONSUME_TIME] = str(stored.reconsume_times + 1)
    properties[MAX_RECONSUME_TIMES] = str(max_times)
    return _copy(stored, dlq_topic, properties, stored.reconsume_times + 1)


def _first_attempt(stored: storage_pb.StoredMessage) -> dict[str, str]:
    properties = {
        name: value
        for name, value in stored.properties.items()
        if name not in SCHEDULE_BOOKKEEPING and name != POP_CHECKPOINT
    }
    properties.setdefault(RETRY_TOPIC, stored.topic)
    properties.setdefault(ORIGIN_MESSAGE_ID, stored.msg_id)
    properties.setdefault(POP_ORIGIN_QUEUE_ID, str(stored.queue_id))
    properties.setdefault(POP_ORIGIN_QUEUE_OFFSET, str(stored.queue_offset))
    return properties


def _copy(
    stored: storage_pb.StoredMessage, topic: str, properties: dict[str, str], reconsume: int
) -> bytes:
    born_host = pack_host(parse_host(stored.born_host)) if stored.born_host else _LOCAL_BORN
    sys_flag = stored.sys_flag & SYSFLAG_PRODUCER_MASK & ~SYSFLAG_BORN_HOST_V6
    if len(born_host) != 8:
        sys_flag |= SYSFLAG_BORN_HOST_V6
    return encode_record(
        topic,
        topic.encode("utf-8"),
        0,
        stored.body,
        encode_properties(properties),
        stored.flag,
        sys_flag,
        stored.born_timestamp_ms,
        born_host,
        _NO_HOST,
        reconsume,
    ).data

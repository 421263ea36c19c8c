"""Timed messages for the timer's process tests: appended straight to a storage's timer
topic as the gateway's rewrite stores them (docs/formats.md, "System topics and
properties"), and the copies delivered to the real topic, read back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import grpc

from tests.services.dispatch.conftest import DispatchProcess
from tests.services.storage.conftest import StorageProcess
from tide.format import (
    DEFAULT_TIMER_PRECISION_MS,
    REAL_QID,
    REAL_TOPIC,
    TIMER_DEL_UNIQKEY,
    TIMER_OUT_MS,
    TIMER_TOPIC,
    UNIQ_KEY,
    TimerWheelGeometry,
    timer_delete_key,
    timer_properties,
    timer_slot_time_ms,
)
from tide.v1 import dispatch_pb2 as dpb
from tide.v1 import storage_pb2 as spb

PRECISION_MS = DEFAULT_TIMER_PRECISION_MS  # the dispatch's default, what the tests start
GEOMETRY = TimerWheelGeometry(PRECISION_MS)
APPEND_BATCH = 500


def timed(real_topic: str, deliver_ms: int, uniq: str, queue_id: int = 0) -> spb.Message:
    """What the gateway stores for a message due at ``deliver_ms`` (tide.format's
    timer_properties); a time already past too, which the gateway would send to the real
    topic at once, to see the timer deliver it in the next slot."""
    properties = timer_properties(
        {UNIQ_KEY: uniq},
        real_topic,
        queue_id,
        deliver_ms,
        0,  # now_ms: long before, so always stored as a timed message
        PRECISION_MS,
    )
    return spb.Message(
        topic=TIMER_TOPIC, queue_id=0, body=uniq.encode(), tags="t", properties=properties
    )


def recall(real_topic: str, deliver_ms: int, uniq: str) -> spb.Message:
    """The delete marker a recall appends (same TIMER_OUT_MS as the message)."""
    properties = {
        REAL_TOPIC: real_topic,
        REAL_QID: "0",
        TIMER_OUT_MS: str(timer_slot_time_ms(GEOMETRY, deliver_ms)),
        TIMER_DEL_UNIQKEY: timer_delete_key(real_topic, uniq),
        UNIQ_KEY: f"recall-{uniq}",
    }
    return spb.Message(topic=TIMER_TOPIC, queue_id=0, body=b"", properties=properties)


def append_all(storage: StorageProcess, messages: Sequence[spb.Message]) -> None:
    for start in range(0, len(messages), APPEND_BATCH):
        results = storage.append(messages[start : start + APPEND_BATCH])
        assert all(r.status == spb.PUT_OK for r in results), results[:3]


def delivered(
    dispatch: DispatchProcess, storage: StorageProcess, topic: str
) -> list[spb.StoredMessage]:
    """Every message of ``topic`` queue 0, read back from the storage."""
    try:
        offsets = dispatch.offsets(topic)
    except grpc.RpcError as exc:  # NOT_FOUND before the first delivery
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return []
    positions: list[tuple[int, int]] = []
    offset = offsets.min_offset
    while offset < offsets.max_offset:
        answer: dpb.GetQueueEntriesResponse = dispatch.entries(topic, 0, offset)
        positions += [(e.physical_offset, e.size) for e in answer.entries]
        if answer.next_offset == offset:
            break
        offset = answer.next_offset
    return [r.message for r in storage.read(positions) if r.status == spb.FOUND]


def count_keys(messages: Sequence[spb.StoredMessage]) -> Counter[str]:
    return Counter(m.properties[UNIQ_KEY] for m in messages)

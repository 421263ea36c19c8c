"""The revive round without processes (services/dispatch/pop/revive.py): an expired
checkpoint's message is stored again in the POP retry topic together with the ack that
resolves it, as ONE run (so a crash leaves both or neither); past the group's retry
maximum, in %DLQ%<group>."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from services.dispatch.pop.revive import Reviver
from services.dispatch.pop.service import PopService
from services.dispatch.pop.state import PopState
from services.dispatch.storage_client import AppendedRun
from tide.format import (
    ACK_TAG,
    RECONSUME_TIME,
    RETRY_TOPIC,
    PopCheckpoint,
    decode_ack,
    decode_record,
)
from tide.v1 import storage_pb2 as storage_pb

NOW_MS = 5_000_000


class FakeStorage:
    def __init__(self, reconsume_times: int, retry_max_times: int) -> None:
        self.message = storage_pb.StoredMessage(
            topic="T",
            queue_id=0,
            queue_offset=9,
            body=b"b",
            tags="TagA",
            properties={"TAGS": "TagA", "UNIQ_KEY": "U1"},
            reconsume_times=reconsume_times,
            msg_id="MSGID",
            born_host="10.0.0.1:5000",
        )
        self.retry_max_times = retry_max_times
        self.topics: list[str] = []

    async def read(self, positions: list[tuple[int, int]]) -> list[storage_pb.ReadResult]:
        return [storage_pb.ReadResult(status=storage_pb.FOUND, message=self.message)]

    async def get_group(self, group: str) -> storage_pb.GroupConfig:
        return storage_pb.GroupConfig(group_name=group, retry_max_times=self.retry_max_times)

    async def upsert_topic(self, topic: str, queue_nums: int, perm: int) -> None:
        self.topics.append(topic)


class FakeService:
    def __init__(self, storage: FakeStorage) -> None:
        self.lock = asyncio.Lock()
        self.state = PopState(checkpoints_max=100)
        self.storage = storage
        self.runs: list[bytes] = []

    def clock_ms(self) -> int:
        return NOW_MS

    async def ready(self) -> None:
        return None

    async def call(self, call: Any) -> Any:
        return await call

    async def append(self, run: bytes, count: int) -> AppendedRun:
        self.runs.append(run)
        return AppendedRun(count, NOW_MS, (100, 200), (0, 1), "0A00000100002A9F")


def _revive(reconsume_times: int, retry_max_times: int) -> tuple[FakeService, list[Any]]:
    storage = FakeStorage(reconsume_times, retry_max_times)
    fake = FakeService(storage)
    fake.state.add(7, PopCheckpoint("G", "T", 0, 9, 4096, 120, 1, NOW_MS - 1, False, "T"))
    asyncio.run(Reviver(cast(PopService, cast(Any, fake))).round())
    (run,) = fake.runs
    records = [decode_record(run, pos, pos + size) for pos, size in _positions(run)]
    return fake, records


def _positions(run: bytes) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    pos = 0
    while pos < len(run):
        size = int.from_bytes(run[pos : pos + 4], "big")
        found.append((pos, size))
        pos += size
    return found


def test_an_expired_message_and_its_ack_are_one_run() -> None:
    fake, (copy, ack) = _revive(reconsume_times=0, retry_max_times=16)
    assert copy.topic == "%RETRY%G_T" and copy.reconsume_times == 1
    assert copy.properties[RECONSUME_TIME] == "1" and copy.properties[RETRY_TOPIC] == "T"
    assert copy.properties["UNIQ_KEY"] == "U1" and copy.properties["POP_CK"] == "7"
    assert ack.properties["TAGS"] == ACK_TAG and decode_ack(ack.body).checkpoint_offset == 7
    assert not fake.state.held
    assert fake.storage.topics == ["%RETRY%G_T"]


def test_past_the_retry_maximum_it_goes_to_the_dead_letter_queue() -> None:
    fake, (copy, ack) = _revive(reconsume_times=2, retry_max_times=2)
    assert copy.topic == "%DLQ%G" and copy.properties["DLQ_ORIGIN_MESSAGE_ID"] == "MSGID"
    assert decode_ack(ack.body).reason == "dlq"
    assert not fake.state.held

"""Re-put against a real storage process: real copies, bad records skipped, outages waited
out without a loss."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from services.dispatch.delivery.reput import DueMessage, Reput
from services.dispatch.storage_client import AppendedRun, StorageClient
from tests._service_process import free_port
from tests.services.dispatch.conftest import DispatchLauncher
from tests.services.storage.conftest import StorageLauncher, message
from tide.format import (
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    DecodedRecord,
    decode_record,
    delay_level_properties,
    timer_properties,
)
from tide.tail import Backoff
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc
from tide.waiting import wait_until_async

USER = {"UNIQ_KEY": "C0A80001000018B4AAC2", "color": "red"}
FAST = Backoff(initial_s=0.05, max_s=0.2)
Position = tuple[int, int]


def scheduled(real_topic: str, real_qid: int, index: int) -> pb.Message:
    properties = delay_level_properties({**USER, "n": str(index)}, real_topic, real_qid, 2)
    return message(
        SCHEDULE_TOPIC,
        1,
        f"body-{index}".encode(),
        tags="TagA",
        keys=[f"key-{index}"],
        properties=properties,
        flag=7,
        born_timestamp_ms=1_000 + index,
        born_host="10.0.0.7:4321",
        reconsume_times=3,
    )


def read_records(target: str, positions: list[Position]) -> list[DecodedRecord]:
    """The records as the storage holds them (Read with spans: the raw bytes)."""
    spans = [pb.RecordSpan(physical_offset=o, size=s, count=1) for o, s in positions]
    with grpc.insecure_channel(target) as channel:
        response = pb_grpc.StorageStub(channel).Read(pb.ReadRequest(spans=spans), timeout=20)
    data, pos, records = response.records, 0, []
    for _, size in positions:
        records.append(decode_record(data, pos, len(data)))
        pos += size
    return records


def positions(results: list[pb.AppendResult]) -> list[Position]:
    return [(r.physical_offset, r.size) for r in results]


class RecordingClient(StorageClient):
    """The dispatch's storage client, noting where each copy was written."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.written: list[Position] = []

    async def append_run(self, run: bytes, count: int) -> AppendedRun:
        appended = await super().append_run(run, count)
        pos = 0
        for offset in appended.physical_offsets:
            size = int.from_bytes(run[pos : pos + 4], "big")
            self.written.append((offset, size))
            pos += size
        return appended


async def reput_all(
    target: str, stored: list[DecodedRecord], max_batch_records: int = 256
) -> tuple[Reput, list[Position]]:
    client = RecordingClient(target)
    reput = Reput(client, "delay_level", backoff=FAST, max_batch_records=max_batch_records)
    await reput.put([DueMessage(record, 0) for record in stored])
    await client.close()
    return reput, client.written


def test_copies_go_to_the_real_topic_with_user_properties_kept(
    launchers: tuple[StorageLauncher, DispatchLauncher], tmp_path: Path
) -> None:
    launcher = launchers[0]
    storage = launcher.start(tmp_path / "store")
    results = storage.append([scheduled("RealTopic", 3, n) for n in range(5)])
    stored = read_records(storage.listen, positions(results))

    reput, written = asyncio.run(reput_all(storage.listen, stored, max_batch_records=2))

    assert (reput.delivered_total, reput.undeliverable_total) == (5, 0)
    copies = read_records(storage.listen, written)
    for index, copy in enumerate(copies):
        assert (copy.topic, copy.queue_id, copy.queue_offset) == ("RealTopic", 3, index)
        assert copy.body == f"body-{index}".encode()
        assert copy.properties == {
            **USER,
            "n": str(index),
            "TAGS": "TagA",
            "KEYS": f"key-{index}",
        }
        assert (copy.flag, copy.reconsume_times, copy.born_timestamp_ms) == (7, 3, 1_000 + index)
        assert str(copy.born_host) == "10.0.0.7:4321"
        assert copy.store_timestamp_ms >= stored[index].store_timestamp_ms


def test_undeliverable_records_are_skipped_and_the_rest_delivered(
    launchers: tuple[StorageLauncher, DispatchLauncher], tmp_path: Path
) -> None:
    launcher = launchers[0]
    # RealTopic is auto-created with 4 queues: REAL_QID 99 is refused INVALID_ARGUMENT.
    storage = launcher.start(tmp_path / "store")
    results = storage.append(
        [
            scheduled("RealTopic", 0, 0),
            scheduled("RealTopic", 99, 1),
            scheduled("RealTopic", 0, 2),
            message(SCHEDULE_TOPIC, 1, b"no destination", properties={"DELAY": "2"}),
            scheduled("RealTopic", 0, 4),
        ]
    )
    stored = read_records(storage.listen, positions(results))
    max_before = storage.status().max_offset

    reput, written = asyncio.run(reput_all(storage.listen, stored))

    assert (reput.delivered_total, reput.undeliverable_total) == (3, 2)
    bodies = [copy.body for copy in read_records(storage.listen, written)]
    assert bodies == [b"body-0", b"body-2", b"body-4"]
    # Nothing else was written: the refused batch left no record behind.
    assert storage.status().max_offset == max_before + sum(size for _, size in written)


def test_an_outage_is_waited_out_and_nothing_is_lost(
    launchers: tuple[StorageLauncher, DispatchLauncher], tmp_path: Path
) -> None:
    launcher = launchers[0]
    listen = ("--listen", f"127.0.0.1:{free_port()}")
    storage = launcher.start(tmp_path / "store", *listen)
    now_ms = 1_700_000_000_000
    properties = timer_properties(USER, "RealTopic", 1, now_ms + 5_000, now_ms, 1000)
    results = storage.append(
        [message(TIMER_TOPIC, 0, b"timed", properties=properties), scheduled("RealTopic", 1, 1)]
    )
    stored = read_records(storage.listen, positions(results))
    target = storage.listen
    storage.stop()

    async def run() -> tuple[Reput, list[Position]]:
        client = RecordingClient(target)
        reput = Reput(client, "timer", backoff=FAST)
        task = asyncio.create_task(reput.put([DueMessage(r, now_ms) for r in stored]))
        await wait_until_async(lambda: reput.failed_attempts >= 2, "the re-put to retry")
        assert not task.done()  # the storage is down: the re-put holds
        await asyncio.to_thread(launcher.start, tmp_path / "store", *listen)
        await asyncio.wait_for(task, timeout=60)
        await client.close()
        return reput, client.written

    reput, written = asyncio.run(run())

    assert (reput.delivered_total, reput.undeliverable_total) == (2, 0)
    copies = read_records(target, written)
    assert [(c.topic, c.queue_id, c.body) for c in copies] == [
        ("RealTopic", 1, b"timed"),
        ("RealTopic", 1, b"body-1"),
    ]
    assert copies[0].properties == USER

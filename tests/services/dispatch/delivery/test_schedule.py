"""Delay levels delivered by a real dispatch process beside a real storage process.

Messages are stored in SCHEDULE_TOPIC_XXXX as the gateway stores them
(tide.format.delay_level_properties) straight through the storage's Append; the test
table is "1s 2s 3s" to keep the tests short. "No earlier than due" is asserted against
store timestamps (the original's and the delivered copy's), never the test's clock.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tests.services.dispatch.conftest import DispatchLauncher, DispatchProcess
from tests.services.storage.conftest import StorageLauncher, StorageProcess, message
from tide.format import SCHEDULE_TOPIC, delay_level_properties, unpack_entry
from tide.v1 import dispatch_pb2
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until

TABLE = ("--message-delay-level", "1s 2s 3s")
FAST = ("--delivery-progress-interval-ms", "200", "--delivery-role-check-interval-ms", "200")
DELAYS_MS = {1: 1000, 2: 2000, 3: 3000}
REAL = "RealTopic"
Launchers = tuple[StorageLauncher, DispatchLauncher]


def scheduled(level: int, index: int, real_qid: int = 0) -> pb.Message:
    properties = delay_level_properties(
        {"UNIQ_KEY": f"UNIQ{level:02d}{index:06d}", "color": "red"}, REAL, real_qid, level
    )
    return message(
        SCHEDULE_TOPIC, level - 1, f"L{level}-{index}".encode(), keys=[f"k{level}-{index}"],
        properties=properties,
    )  # fmt: skip


def start_pair(
    launchers: Launchers, root: Path, *extra: str
) -> tuple[StorageProcess, DispatchProcess]:
    storages, dispatches = launchers
    storage = storages.start(root / "storage")
    dispatch = dispatches.start(root / "dispatch", storage.listen, *TABLE, *FAST, *extra)
    return storage, dispatch


def delivered(
    storage: StorageProcess, dispatch: DispatchProcess, queue_id: int = 0
) -> list[pb.StoredMessage]:
    """The copies in REAL queue ``queue_id``, in queue order."""
    try:
        entries = dispatch.entries(REAL, queue_id).entries
    except Exception:
        return []
    results = storage.read([(e.physical_offset, e.size) for e in entries])
    return [r.message for r in results]


def wait_delivered(
    storage: StorageProcess, dispatch: DispatchProcess, count: int, timeout_s: float = 60
) -> list[pb.StoredMessage]:
    wait_until(
        lambda: len(delivered(storage, dispatch)) >= count,
        f"{count} delivered copies in {REAL}",
        timeout_s,
        state=lambda: (len(delivered(storage, dispatch)), dispatch.status().delivery),
    )
    return delivered(storage, dispatch)


def test_each_level_arrives_no_earlier_than_due_and_once(
    launchers: Launchers, tmp_path: Path
) -> None:
    storage, dispatch = start_pair(launchers, tmp_path)
    originals = {}
    for level in DELAYS_MS:
        for result, sent in zip(
            storage.append([scheduled(level, i) for i in range(3)]),
            [scheduled(level, i) for i in range(3)],
            strict=True,
        ):
            originals[sent.properties["UNIQ_KEY"]] = (level, result)

    copies = wait_delivered(storage, dispatch, len(originals))

    counts = Counter(copy.properties["UNIQ_KEY"] for copy in copies)
    assert counts == Counter({uniq: 1 for uniq in originals})
    for copy in copies:
        level, original = originals[copy.properties["UNIQ_KEY"]]
        assert copy.store_timestamp_ms >= original.store_timestamp_ms + DELAYS_MS[level]
        assert copy.topic == REAL and copy.queue_id == 0
        assert copy.properties["color"] == "red"
        assert not {"DELAY", "REAL_TOPIC", "REAL_QID"} & set(copy.properties)
    status = dispatch.status().delivery
    assert list(status.delay_levels_ms) == [1000, 2000, 3000]
    assert status.active and list(status.delay_level_pending) == [0, 0, 0]


def test_schedule_entries_carry_the_delivery_time(launchers: Launchers, tmp_path: Path) -> None:
    """docs/formats.md "Delay levels": the entry's tags code is store time + delay."""
    storage, dispatch = start_pair(launchers, tmp_path)
    (result,) = storage.append([scheduled(3, 0)])
    dispatch.wait_dispatched(storage.status().max_offset)
    (entry,) = dispatch.entries(SCHEDULE_TOPIC, 2).entries
    assert entry.tags_code == result.store_timestamp_ms + 3000
    queue_file = tmp_path / "dispatch" / "consumequeue" / SCHEDULE_TOPIC / "2"
    data = next(queue_file.iterdir()).read_bytes()
    assert unpack_entry(data, 0) == (result.physical_offset, result.size, entry.tags_code)


def test_delivered_copy_is_found_by_key_and_unique_key(
    launchers: Launchers, tmp_path: Path
) -> None:
    storage, dispatch = start_pair(launchers, tmp_path)
    storage.append([scheduled(1, 7)])
    (copy,) = wait_delivered(storage, dispatch, 1)
    for key in ("k1-7", "UNIQ01000007"):
        hits = dispatch.stub.QueryIndex(
            dispatch_pb2.QueryIndexRequest(topic=REAL, key=key, max_count=10), timeout=20
        ).hits
        assert [hit.physical_offset for hit in hits] == [copy.physical_offset], key


def test_progress_survives_a_restart_and_a_sigkill(launchers: Launchers, tmp_path: Path) -> None:
    dispatches = launchers[1]
    storage, dispatch = start_pair(launchers, tmp_path)
    storage.append([scheduled(1, i) for i in range(5)])
    wait_delivered(storage, dispatch, 5)
    progress = tmp_path / "dispatch" / "config" / "delayOffset.json"
    wait_until(
        lambda: progress.exists() and json.loads(progress.read_text())["offsetTable"]["1"] == 5,
        "delayOffset.json to record level 1 at 5",
    )
    dispatch.stop()
    storage.append([scheduled(1, i) for i in range(5, 10)])
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen, *TABLE, *FAST)
    copies = wait_delivered(storage, dispatch, 10)
    assert len(copies) == 10  # a clean stop saved its progress: nothing twice

    storage.append([scheduled(2, i) for i in range(10, 40)])
    dispatch.kill()
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen, *TABLE, *FAST)
    copies = wait_delivered(storage, dispatch, 40)
    counts = Counter(copy.properties["UNIQ_KEY"] for copy in copies)
    assert set(counts) == {f"UNIQ{1 if i < 10 else 2:02d}{i:06d}" for i in range(40)}
    duplicates = sum(counts.values()) - len(counts)
    print(f"duplicates after SIGKILL: {duplicates}")  # at-least-once: reported, not failed


def test_a_dispatch_beside_a_slave_holds(launchers: Launchers, tmp_path: Path) -> None:
    storages, dispatches = launchers
    master = storages.start(tmp_path / "master", "--ha-heartbeat-interval-ms", "500")
    slave = storages.start(
        tmp_path / "slave", "--role", "SLAVE", "--broker-id", "1", "--master", master.listen,
        "--ha-heartbeat-interval-ms", "500",
    )  # fmt: skip
    beside_slave = dispatches.start(tmp_path / "d-slave", slave.listen, *TABLE, *FAST)
    master.append([scheduled(1, i) for i in range(3)])
    target = master.status().max_offset
    wait_until(lambda: slave.status().max_offset == target, "the slave to catch up")
    beside_slave.wait_dispatched(target)
    wait_until(
        lambda: list(beside_slave.status().delivery.delay_level_pending) == [3, 0, 0],
        "the slave's dispatch to see 3 pending",
    )
    # Once due (1 s after the store time) a master's dispatch would deliver; this one holds.
    beside_master = dispatches.start(tmp_path / "d-master", master.listen, *TABLE, *FAST)
    copies = wait_delivered(master, beside_master, 3)
    assert len(copies) == 3
    status = beside_slave.status().delivery
    assert not status.active
    assert list(status.delay_level_pending) == [3, 0, 0]
    assert not (tmp_path / "d-slave" / "config" / "delayOffset.json").exists()


def test_a_bad_delay_level_table_refuses_the_start(launchers: Launchers, tmp_path: Path) -> None:
    storage = launchers[0].start(tmp_path / "storage")
    dispatch = launchers[1].spawn(
        tmp_path / "dispatch", storage.listen, "--message-delay-level", "1s 5x"
    )
    assert dispatch.wait_exit() == 2
    assert "--message-delay-level: delay level 2 is '5x'; write a count and a unit" in (
        dispatch.stderr()
    )

"""The storage's duplicate window (engine/producer_state.py): next, retry, gap, overlap,
the bounded window, expiry and the producer limit, replay of records, and a snapshot
written, loaded and installed (a slave)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.storage.engine.errors import (
    AlreadyStoredError,
    FencedProducerError,
    ProducerLimitError,
    SequenceError,
)
from services.storage.engine.producer_state import ProducerStateTable
from tide.files import ConfigFormatError
from tide.format import PRODUCER_EPOCH, PRODUCER_ID, PRODUCER_SEQ, PRODUCER_STATE_FILE, BatchEntry

KEY = ("T", 0)


def table(tmp_path: Path, **kw: int) -> ProducerStateTable:
    args = {"window_batches": 3, "expiry_ms": 1_000, "max_producers": 2} | kw
    return ProducerStateTable(tmp_path, **args)


def entry(first: int, count: int, offset: int = 0) -> BatchEntry:
    return BatchEntry(
        first,
        first + count - 1,
        5,
        [offset + 100 * i for i in range(count)],
        [first + i for i in range(count)],
        [100] * count,
    )


def test_next_retry_gap_and_overlap(tmp_path: Path) -> None:
    t = table(tmp_path)
    assert t.check("p", KEY, 0, 0, 1) is None
    stored = entry(0, 2)
    t.record("p", KEY, 0, stored, 0)
    assert t.check("p", KEY, 0, 0, 1) is stored
    assert t.check("p", KEY, 0, 2, 4) is None
    with pytest.raises(SequenceError, match="a gap; the next expected is 2"):
        t.check("p", KEY, 0, 3, 3)
    with pytest.raises(SequenceError, match="another size"):
        t.check("p", KEY, 0, 0, 0)
    assert t.check("p", ("T", 1), 0, 7, 7) is None  # per queue: unknown takes any start


def test_the_window_keeps_the_last_batches(tmp_path: Path) -> None:
    t = table(tmp_path)
    for first in range(5):
        t.record("p", KEY, 0, entry(first, 1), 0)
    assert t.check("p", KEY, 0, 4, 4) is not None
    assert t.check("p", KEY, 0, 2, 2) is not None
    with pytest.raises(AlreadyStoredError, match="stored before, older than the window"):
        t.check("p", KEY, 0, 1, 1)
    with pytest.raises(SequenceError, match="older than the window"):
        t.check("p", KEY, 0, 1, 2)  # overlaps the window: not a batch it kept


def test_a_newer_epoch_starts_afresh_and_an_older_one_is_fenced(tmp_path: Path) -> None:
    t = table(tmp_path)
    t.record("p", KEY, 3, entry(0, 5), 0)
    t.record("p", ("T", 1), 3, entry(0, 1), 0)
    assert t.check("p", KEY, 4, 0, 0) is None
    t.record("p", KEY, 4, entry(0, 1), 0)
    assert t.check("p", ("T", 1), 4, 0, 0) is None  # every queue starts again
    assert t.check("p", KEY, 4, 0, 0) is not None
    with pytest.raises(FencedProducerError, match="epoch 3 is older than its current epoch 4"):
        t.check("p", KEY, 3, 0, 4)


def test_idle_ids_expire_and_the_producer_limit_holds(tmp_path: Path) -> None:
    t = table(tmp_path)
    t.record("a", KEY, 0, entry(0, 1), 0)
    t.record("b", KEY, 0, entry(0, 1), 900)
    with pytest.raises(ProducerLimitError, match="max_idempotent_producers"):
        t.check_room("c", 999)
    t.check_room("c", 1_001)  # "a" idle past 1000 ms: forgotten
    assert t.producer_count == 1
    assert t.check("a", KEY, 0, 5, 5) is None


def test_replay_groups_records_into_batches(tmp_path: Path) -> None:
    t = table(tmp_path)

    def rec(
        offset: int, seqs: str, pid: str = "p"
    ) -> tuple[int, int, str, int, int, int, dict[str, str]]:
        return (offset, 100, "T", 0, offset // 100, 9, {PRODUCER_ID: pid, PRODUCER_SEQ: seqs})

    plain = (50, 100, "T", 0, 0, 9, {"TAGS": "x"})
    records = [rec(100, "0-1"), plain, rec(200, "0-1"), rec(300, "2-2"), rec(400, "2-2")]
    assert t.replay(records) == 3  # 0-1, 2-2, and 2-2 again (a second batch)
    found = t.check("p", KEY, 0, 0, 1)
    assert found is not None and found.physical_offsets == [100, 200]
    epoch_record = (
        500,
        100,
        "T",
        0,
        5,
        9,
        {PRODUCER_ID: "p", PRODUCER_SEQ: "0-0", PRODUCER_EPOCH: "2"},
    )
    assert t.replay([epoch_record]) == 1
    with pytest.raises(FencedProducerError):
        t.check("p", KEY, 0, 0, 1)
    assert t.check("p", KEY, 2, 0, 0) is not None


def test_snapshot_write_load_drop_and_install(tmp_path: Path) -> None:
    t = table(tmp_path)
    t.record("p", KEY, 0, entry(0, 2, offset=1_000), 0)
    t.write(t.copy(4_000))
    loaded = table(tmp_path)
    assert loaded.load() == 4_000
    assert loaded.check("p", KEY, 0, 0, 1) is not None
    loaded.drop_from(1_050)  # the batch's last record at 1100 was cut by a crash
    assert loaded.check("p", KEY, 0, 7, 7) is None
    slave_dir = tmp_path / "slave"
    slave_dir.mkdir()
    slave = table(slave_dir)
    slave.install((tmp_path / PRODUCER_STATE_FILE).read_bytes())
    assert slave.check("p", KEY, 0, 0, 1) is not None
    with pytest.raises(ConfigFormatError):
        slave.install(b'{"version": 9}')
    assert slave.check("p", KEY, 0, 0, 1) is not None  # the bad copy changed nothing

"""The store root's small files (abort, queue_offsets.json) and the rule they feed:
:class:`TailMarks` tells a crash's interrupted write from corruption."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tide.format import (
    ABORT_FILE,
    SNAPSHOT_FILE,
    Snapshot,
    TailMarks,
    read_snapshot,
    read_tail_marks,
    write_snapshot,
)

DURABLE = 1000


@pytest.mark.parametrize(
    ("bad_offset", "data_follows", "crashed", "corruption"),
    [
        # Below the durable offset a flushed write went bad, whatever follows.
        (DURABLE - 1, False, True, True),
        (DURABLE - 1, True, True, True),
        (DURABLE - 1, False, False, True),
        # At or past it, with nothing valid after: the end of the data.
        (DURABLE, False, True, False),
        (DURABLE, False, False, False),
        # Valid data after it: the write a crash interrupted; after a clean close, none was.
        (DURABLE, True, True, False),
        (DURABLE + 5000, True, True, False),
        (DURABLE, True, False, True),
    ],
)
def test_tail_marks_rule(
    bad_offset: int, data_follows: bool, crashed: bool, corruption: bool
) -> None:
    marks = TailMarks(DURABLE, crashed)
    assert marks.is_corruption(bad_offset, data_follows) is corruption


def test_no_marks_means_invalid_bytes_followed_by_data_are_corruption() -> None:
    assert TailMarks().is_corruption(0, data_follows=True)
    assert not TailMarks().is_corruption(0, data_follows=False)


def test_read_tail_marks_of_a_clean_store(tmp_path: Path) -> None:
    assert read_tail_marks(tmp_path) == TailMarks(0, crashed=False)
    write_snapshot(tmp_path, Snapshot(DURABLE, DURABLE + 10, {("T", 0): 3}))
    assert read_tail_marks(tmp_path) == TailMarks(DURABLE + 10, crashed=False)


def test_read_tail_marks_after_a_crash(tmp_path: Path) -> None:
    (tmp_path / ABORT_FILE).touch()
    assert read_tail_marks(tmp_path) == TailMarks(0, crashed=True)
    write_snapshot(tmp_path, Snapshot(DURABLE, DURABLE + 10, {}))
    assert read_tail_marks(tmp_path) == TailMarks(DURABLE + 10, crashed=True)


def test_unreadable_snapshot_leaves_no_durable_offset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / ABORT_FILE).touch()
    (tmp_path / SNAPSHOT_FILE).write_text('{"commitlogOffset": 5}')  # no flushedOffset
    with caplog.at_level(logging.ERROR):
        assert read_tail_marks(tmp_path) == TailMarks(0, crashed=True)
    assert "unusable" in caplog.text


def test_snapshot_round_trip(tmp_path: Path) -> None:
    snapshot = Snapshot(DURABLE, DURABLE + 10, {("Topic-A", 3): 7, ("B", 0): 1})
    write_snapshot(tmp_path, snapshot)
    assert read_snapshot(tmp_path) == snapshot
    assert read_snapshot(tmp_path / "missing") is None

"""The records arrival notices carried, kept for the pulls after them (arrived.py): what a
pull is answered from them, and when it is not (then it asks the dispatch)."""

from __future__ import annotations

import logging
import struct
from typing import Any

import pytest

from services.gateway.arrived import KEEP_S, Answer, ArrivedRecords
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import storage_pb2 as storage_pb

KEY = ("dispatch:1", "T", 0)
_SIZE = struct.Struct(">i")


def record(label: str, size: int = 32) -> bytes:
    """A stand-in record: its TOTALSIZE (all the run reads of it), then its label."""
    body = label.encode().ljust(size - _SIZE.size, b".")
    return _SIZE.pack(size) + body


def notice(
    offset: int, spans: list[list[bytes]], *, max_offset: int | None = None, min_offset: int = 0
) -> dispatch_pb.ArrivalNotice:
    """A notice whose entries start at ``offset``: runs of adjacent records (``spans``)."""
    count = sum(len(span) for span in spans)
    entries = dispatch_pb.GetQueueEntriesResponse(
        next_offset=offset + count,
        min_offset=min_offset,
        max_offset=offset + count if max_offset is None else max_offset,
        spans=[
            storage_pb.RecordSpan(physical_offset=0, size=sum(map(len, span)), count=len(span))
            for span in spans
        ],
        records=b"".join(b"".join(span) for span in spans),
    )
    return dispatch_pb.ArrivalNotice(
        topic=KEY[1],
        queue_id=KEY[2],
        max_offset=entries.max_offset,
        entries_offset=offset,
        entries=entries,
    )


def labels(answer: Answer | None) -> list[str]:
    assert answer is not None
    out, pos = [], 0
    while pos < len(answer.records):
        (size,) = _SIZE.unpack_from(answer.records, pos)
        out.append(answer.records[pos + 4 : pos + size].rstrip(b".").decode())
        pos += size
    assert len(out) == answer.count
    return out


def records(first: int, count: int, size: int = 32) -> list[bytes]:
    return [record(f"m{i}", size) for i in range(first, first + count)]


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class Fed:
    """ArrivedRecords fed as HeldPulls feeds it: every notice's max offset is its queue's
    announced max, which answers are judged against."""

    def __init__(self, arrived: ArrivedRecords) -> None:
        self.arrived = arrived
        self.announced: dict[tuple[str, str, int], int] = {}

    def add(self, key: tuple[str, str, int], notice: dispatch_pb.ArrivalNotice) -> None:
        self.announced[key] = notice.max_offset
        self.arrived.add(key, notice)

    def answer(
        self, key: tuple[str, str, int], offset: int, max_messages: int, max_bytes: int
    ) -> Answer | None:
        max_offset = self.announced.get(key, 0)
        return self.arrived.answer(key, offset, max_messages, max_bytes, max_offset)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.arrived, name)


def kept(
    max_bytes: int = 1 << 20, queue_max_bytes: int = 1 << 20, clock: Clock | None = None
) -> Fed:
    return Fed(
        ArrivedRecords(max_bytes=max_bytes, queue_max_bytes=queue_max_bytes, clock=clock or Clock())
    )


def test_a_pull_in_the_run_is_answered_from_its_offset_across_spans_and_notices() -> None:
    arrived = kept()
    arrived.add(KEY, notice(10, [records(10, 3), records(13, 2)]))
    arrived.add(KEY, notice(15, [records(15, 4)], min_offset=2))
    answer = arrived.answer(KEY, 11, 32, 1 << 20)
    assert labels(answer) == [f"m{i}" for i in range(11, 19)]
    assert answer is not None
    assert (answer.next_offset, answer.min_offset, answer.max_offset) == (19, 2, 19)
    assert labels(arrived.answer(KEY, 15, 32, 1 << 20)) == ["m15", "m16", "m17", "m18"]
    assert labels(arrived.answer(KEY, 18, 32, 1 << 20)) == ["m18"]
    assert arrived.answers == 3


def test_an_answer_stops_at_max_messages_or_before_the_record_passing_max_bytes() -> None:
    arrived = kept()
    arrived.add(KEY, notice(0, [records(0, 4)]))
    arrived.add(KEY, notice(4, [records(4, 4)]))
    assert labels(arrived.answer(KEY, 1, 2, 1 << 20)) == ["m1", "m2"]
    assert labels(arrived.answer(KEY, 3, 3, 1 << 20)) == ["m3", "m4", "m5"]
    assert labels(arrived.answer(KEY, 2, 32, 3 * 32 + 31)) == ["m2", "m3", "m4"]
    assert labels(arrived.answer(KEY, 2, 32, 3 * 32)) == ["m2", "m3", "m4"]
    # At least one, however small the byte limit.
    assert labels(arrived.answer(KEY, 6, 32, 1)) == ["m6"]
    answer = arrived.answer(KEY, 7, 1, 1)
    assert labels(answer) == ["m7"]
    assert answer is not None and answer.next_offset == 8


def test_offsets_outside_the_run_are_not_answered() -> None:
    arrived = kept()
    assert arrived.answer(KEY, 0, 32, 1 << 20) is None  # nothing kept
    arrived.add(KEY, notice(10, [records(10, 2)]))
    assert arrived.answer(KEY, 9, 32, 1 << 20) is None  # before it
    assert arrived.answer(KEY, 12, 32, 1 << 20) is None  # its end: nothing new
    assert arrived.answer(("dispatch:2", "T", 0), 10, 32, 1 << 20) is None  # another member
    assert arrived.answers == 0


def test_a_notice_not_where_the_run_ends_starts_it_again() -> None:
    arrived = kept()
    arrived.add(KEY, notice(0, [records(0, 2)]))
    arrived.add(KEY, notice(5, [records(5, 2)]))  # 2..4 came in a notice without records
    assert arrived.answer(KEY, 1, 32, 1 << 20) is None
    assert labels(arrived.answer(KEY, 5, 32, 1 << 20)) == ["m5", "m6"]
    assert arrived.size_bytes == 2 * 32


def test_a_run_ending_before_the_announced_max_answers_only_a_full_pull() -> None:
    """The dispatch has more than the run (a notice without records moved the max):
    a pull the run cannot fill asks it; one the run fills is answered."""
    arrived = kept()
    arrived.add(KEY, notice(0, [records(0, 3)]))
    arrived.add(KEY, dispatch_pb.ArrivalNotice(topic="T", queue_id=0, max_offset=9))
    assert arrived.answer(KEY, 1, 32, 1 << 20) is None
    answer = arrived.answer(KEY, 1, 2, 1 << 20)
    assert labels(answer) == ["m1", "m2"]
    assert answer is not None and answer.max_offset == 9
    assert labels(arrived.answer(KEY, 0, 32, 2 * 32)) == ["m0", "m1"]


def test_a_queue_keeps_its_newest_pieces_within_its_bound() -> None:
    arrived = kept(queue_max_bytes=4 * 32)
    for first in (0, 2, 4):
        arrived.add(KEY, notice(first, [records(first, 2)]))
    assert arrived.size_bytes == 4 * 32
    assert arrived.answer(KEY, 1, 32, 1 << 20) is None  # dropped
    assert labels(arrived.answer(KEY, 2, 32, 1 << 20)) == ["m2", "m3", "m4", "m5"]
    # A piece larger than the bound alone is kept (the newest always is).
    arrived.add(KEY, notice(6, [records(6, 8)]))
    assert arrived.size_bytes == 8 * 32
    assert labels(arrived.answer(KEY, 13, 32, 1 << 20)) == ["m13"]


def test_all_queues_keep_at_most_max_bytes_the_least_recently_grown_going_first() -> None:
    arrived = kept(max_bytes=5 * 32)
    other = ("dispatch:1", "T", 1)
    arrived.add(KEY, notice(0, [records(0, 2)]))
    arrived.add(other, notice(0, [records(0, 2)]))
    arrived.add(KEY, notice(2, [records(2, 1)]))  # KEY grew last
    arrived.add(other, notice(2, [records(2, 1)]))  # 6 records: KEY goes
    assert arrived.answer(KEY, 0, 32, 1 << 20) is None
    assert labels(arrived.answer(other, 0, 32, 1 << 20)) == ["m0", "m1", "m2"]
    assert arrived.size_bytes == 3 * 32
    nothing = kept(max_bytes=0)
    nothing.add(KEY, notice(0, [records(0, 1)]))
    assert nothing.answer(KEY, 0, 32, 1 << 20) is None
    assert nothing.size_bytes == 0


def test_pieces_older_than_keep_s_are_not_answered_from() -> None:
    clock = Clock()
    arrived = kept(clock=clock)
    arrived.add(KEY, notice(0, [records(0, 2)]))
    clock.now_s += KEEP_S / 2
    arrived.add(KEY, notice(2, [records(2, 2)]))
    clock.now_s += KEEP_S / 2 + 0.001
    assert arrived.answer(KEY, 0, 32, 1 << 20) is None  # the first piece is too old
    assert labels(arrived.answer(KEY, 2, 32, 1 << 20)) == ["m2", "m3"]
    clock.now_s += KEEP_S
    assert arrived.answer(KEY, 2, 32, 1 << 20) is None
    assert arrived.size_bytes == 0


def test_forgotten_queues_and_addresses_answer_nothing() -> None:
    arrived = kept()
    elsewhere = ("dispatch:2", "T", 0)
    arrived.add(KEY, notice(0, [records(0, 1)]))
    arrived.add(("dispatch:1", "T", 1), notice(0, [records(0, 1)]))
    arrived.add(elsewhere, notice(0, [records(0, 1)]))
    arrived.forget(("dispatch:1", "T", 1))
    assert arrived.size_bytes == 2 * 32
    arrived.forget_address("dispatch:1")
    assert arrived.answer(KEY, 0, 32, 1 << 20) is None
    assert labels(arrived.answer(elsewhere, 0, 32, 1 << 20)) == ["m0"]
    assert arrived.size_bytes == 32


@pytest.mark.parametrize(
    "damage",
    [pytest.param(0, id="zero-size"), pytest.param(1_000, id="past-its-span")],
)
def test_records_that_do_not_split_as_their_spans_say_are_dropped(
    damage: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Never sent so (the dispatch's records are stored, checked ones); asked of the
    dispatch instead, with a warning, and not kept."""
    arrived = kept()
    bad = [record("m0"), _SIZE.pack(damage) + b"x" * 28, record("m2")]
    arrived.add(KEY, notice(0, [bad]))
    with caplog.at_level(logging.WARNING, "tide.gateway.arrived"):
        assert arrived.answer(KEY, 2, 32, 1 << 20) is None
    assert "a record of" in caplog.text
    assert arrived.size_bytes == 0


def test_a_notice_whose_records_are_not_its_spans_bytes_is_not_kept() -> None:
    arrived = kept()
    short = notice(0, [records(0, 2)])
    short.entries.records = short.entries.records[:-1]
    arrived.add(KEY, short)
    assert arrived.size_bytes == 0
    assert arrived.answer(KEY, 0, 32, 1 << 20) is None


def test_queues_that_stopped_growing_are_forgotten_as_others_grow() -> None:
    clock = Clock()
    arrived = kept(clock=clock)
    idle, busy = ("dispatch:1", "T", 1), KEY
    arrived.add(idle, notice(0, [records(0, 2)]))
    arrived.add(busy, notice(0, [records(0, 1)]))
    clock.now_s += KEEP_S - 1
    arrived.add(busy, notice(1, [records(1, 1)]))
    assert arrived.size_bytes == 4 * 32  # the idle queue's run is not KEEP_S old yet
    clock.now_s += 2
    arrived.add(busy, notice(2, [records(2, 1)]))
    assert arrived.size_bytes == 3 * 32  # now it is, and nobody pulled it since
    assert arrived.answer(busy, 0, 32, 1 << 20) is None  # its own first piece is too
    assert labels(arrived.answer(busy, 1, 32, 1 << 20)) == ["m1", "m2"]


def test_a_piece_larger_than_all_runs_may_keep_is_not_kept() -> None:
    arrived = kept(max_bytes=2 * 32)
    arrived.add(KEY, notice(0, [records(0, 3)]))
    assert arrived.size_bytes == 0
    assert arrived.answer(KEY, 0, 32, 1 << 20) is None

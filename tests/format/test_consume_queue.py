"""Consume queue entries and where entry n lives."""

from __future__ import annotations

import random
import struct

import pytest

from tide.format import (
    DEFAULT_ENTRIES_PER_SEGMENT,
    DEFAULT_SEGMENT_BYTES,
    ENTRY_BYTES,
    PRE_BLANK_ENTRY,
    PRE_BLANK_SIZE,
    ConsumeQueueEntry,
    consume_queue_segment_bytes,
    consume_queue_segment_name,
    entry_is_written,
    first_queue_offset,
    iter_entries,
    logical_position,
    pack_entries,
    pack_entry,
    pack_entry_into,
    position_in_segment,
    segment_start_for,
    tags_code,
    unpack_entry,
)


def test_worked_example_entry_is_byte_exact() -> None:
    """The worked example of docs/formats.md, "Consume queue"."""
    data = pack_entry(5_000, 115, tags_code("TagA"))
    assert data == bytes.fromhex("0000000000001388 00000073 000000000027A807")
    assert unpack_entry(data) == ConsumeQueueEntry(5_000, 115, 2_598_919)
    assert segment_start_for(300_001) == 6_000_000
    assert consume_queue_segment_name(300_001) == "00000000000006000000"
    assert position_in_segment(300_001) == 20


def test_entry_layout() -> None:
    assert ENTRY_BYTES == 20
    data = pack_entry(-2, 0x01020304, -1)  # tags codes are signed 64-bit
    assert data == struct.pack(">qiq", -2, 0x01020304, -1)
    assert data[8:12] == bytes([1, 2, 3, 4])
    assert data[12:] == b"\xff" * 8
    assert unpack_entry(data) == (-2, 0x01020304, -1)


def test_pack_into_and_unpack_at_a_position() -> None:
    buf = bytearray(3 * ENTRY_BYTES)
    pack_entry_into(buf, 2 * ENTRY_BYTES, 7, 8, 9)
    assert buf[: 2 * ENTRY_BYTES] == bytes(2 * ENTRY_BYTES)
    assert unpack_entry(buf, 2 * ENTRY_BYTES) == ConsumeQueueEntry(7, 8, 9)
    with pytest.raises(struct.error):
        unpack_entry(buf, 2 * ENTRY_BYTES + 1)


def test_written_entries_follow_rocketmq_recovery() -> None:
    assert not entry_is_written(unpack_entry(bytes(ENTRY_BYTES)))  # all zero: the end
    assert entry_is_written(ConsumeQueueEntry(0, 115, 0))  # offset 0 is a real message
    assert not entry_is_written(ConsumeQueueEntry(-1, 115, 0))
    assert not entry_is_written(ConsumeQueueEntry(5, 0, 0))
    assert unpack_entry(PRE_BLANK_ENTRY) == ConsumeQueueEntry(0, 2**31 - 1, 0)
    assert entry_is_written(unpack_entry(PRE_BLANK_ENTRY))


def test_default_segment() -> None:
    assert DEFAULT_ENTRIES_PER_SEGMENT == 300_000
    assert DEFAULT_SEGMENT_BYTES == consume_queue_segment_bytes() == 6_000_000
    assert segment_start_for(0) == 0
    assert segment_start_for(299_999) == 0
    assert position_in_segment(299_999) == 5_999_980
    assert segment_start_for(300_000) == 6_000_000
    assert position_in_segment(300_000) == 0


@pytest.mark.parametrize(
    ("queue_offset", "start", "pos"),
    [(0, 0, 0), (1, 0, 20), (2, 0, 40), (3, 60, 0), (5, 60, 40), (6, 120, 0), (10, 180, 20)],
)
def test_positions_across_tiny_segments(queue_offset: int, start: int, pos: int) -> None:
    per_segment = 3  # 60-byte segments
    assert logical_position(queue_offset) == queue_offset * 20
    assert segment_start_for(queue_offset, per_segment) == start
    assert position_in_segment(queue_offset, per_segment) == pos
    assert start + pos == logical_position(queue_offset)
    assert consume_queue_segment_name(queue_offset, per_segment) == f"{start:020d}"
    assert first_queue_offset(start) <= queue_offset < first_queue_offset(start) + per_segment


def test_first_queue_offset() -> None:
    assert first_queue_offset(6_000_000) == 300_000
    with pytest.raises(ValueError, match="multiple of 20"):
        first_queue_offset(6_000_001)
    with pytest.raises(ValueError, match="multiple of 20"):
        first_queue_offset(-20)


@pytest.mark.parametrize("count", [0, 1, 15, 16, 17, 200])
def test_pack_entries_is_pack_entry_of_each(count: int) -> None:
    """Every path: one struct call per entry, and the column-wise one for runs whose
    entries share the tags code (same sizes or not), from lists, tuples, iterators."""
    rnd = random.Random(count)
    offsets = [rnd.randrange(2**63) for _ in range(count)]
    for sizes, codes in (
        ([rnd.randrange(-(2**31), 2**31) for _ in range(count)], [-5] * count),
        ([170] * count, [tags_code("TagA")] * count),
        ([170] * count, [rnd.randrange(-(2**63), 2**63) for _ in range(count)]),
    ):
        want = b"".join(map(pack_entry, offsets, sizes, codes))
        assert pack_entries(offsets, sizes, codes) == want
        assert pack_entries(tuple(offsets), tuple(sizes), tuple(codes)) == want
        assert pack_entries(iter(offsets), iter(sizes), iter(codes)) == want


@pytest.mark.parametrize(
    ("offsets", "sizes"), [([2**63] * 20, [1] * 20), ([1] * 20, [1] * 19 + [2**31])]
)
def test_pack_entries_refuses_values_that_do_not_fit(offsets: list[int], sizes: list[int]) -> None:
    with pytest.raises((OverflowError, struct.error)):
        pack_entries(offsets, sizes, [0] * 20)


def test_iter_entries_reads_what_pack_entries_wrote() -> None:
    offsets, sizes, codes = [0, 120, 2**40], [120, PRE_BLANK_SIZE, 7], [5, 0, -3]
    data = pack_entries(offsets, sizes, codes)
    assert list(iter_entries(data)) == list(zip(offsets, sizes, codes, strict=True))
    assert list(iter_entries(b"")) == []

"""The compiled run scan (``tide.format._ccore.scan_v4_run``) against its Python reference
(``tide.format.V4RunScanner``, through ``ChunkScanner(compiled=False)``): same stop, same
columns, on random streams, damaged ones (bytes flipped, records cut, non-UTF-8 topics,
wrong CRCs and offsets) and edge cases (empty ranges, windows of every size, limits on the
record size). Skipped when the
extension is not built (the suite then runs the Python path alone; test_core_selection
fails if it should have been built)."""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest

import tide.tail._batch as batch_module
from tests.tail.test_batch import make_record, random_stream
from tide.format import V4RunScanner
from tide.format._core import ccore
from tide.tail._batch import BatchBuilder, ChunkScanner

pytestmark = pytest.mark.skipif(ccore is None, reason="the compiled core is not built or is off")


def scanned(
    compiled: bool, buf: bytes, start: int, end: int, base: int, **kwargs: Any
) -> tuple[int, dict[str, list[Any]]]:
    scanner = ChunkScanner(compiled=compiled, **kwargs)
    out = BatchBuilder()
    stop = scanner.scan(buf, start, base, out, end)
    batch = out.build()
    # (compared as lists: the compiled scan's integer columns are array('q'), the
    # reference's lists; test_integer_columns_... below holds each to its kind)
    return stop, {name: list(getattr(batch, name)) for name in batch_module._BATCH_COLUMNS}


def assert_same(buf: bytes, start: int, end: int, base: int, **kwargs: Any) -> int:
    python = scanned(False, buf, start, end, base, **kwargs)
    compiled = scanned(True, buf, start, end, base, **kwargs)
    assert compiled == python, (start, end, base, kwargs)
    return python[0]


def damage(rnd: random.Random, data: bytes) -> bytes:
    """``data`` with a few bytes changed, or cut short, or a run of it zeroed."""
    out = bytearray(data)
    kind = rnd.randrange(3)
    if kind == 0:
        for _ in range(rnd.randint(1, 4)):
            out[rnd.randrange(len(out))] = rnd.randrange(256)
    elif kind == 1:
        del out[rnd.randrange(len(out)) :]
    else:
        at = rnd.randrange(len(out))
        out[at : at + rnd.randint(1, 200)] = bytes(min(200, len(out) - at))
    return bytes(out)


@pytest.mark.parametrize("seed", range(40))
def test_random_streams_scan_the_same(seed: int) -> None:
    rnd = random.Random(seed)
    data, offsets = random_stream(rnd, rnd.randint(1, 60), blanks=rnd.random() < 0.5)
    start = rnd.choice([0, *offsets])
    for check_crc in (False, True):
        assert_same(data, start, len(data), 0, max_record_bytes=1 << 20, check_crc=check_crc)
        assert_same(data, start, rnd.randint(start, len(data)), 0, max_record_bytes=1 << 20)


@pytest.mark.parametrize("seed", range(200))
def test_damaged_streams_scan_the_same(seed: int) -> None:
    rnd = random.Random(1000 + seed)
    data, offsets = random_stream(rnd, rnd.randint(1, 30), blanks=False)
    data = damage(rnd, data)
    start = rnd.choice([0, *[o for o in offsets if o < len(data)]])
    base = rnd.choice([0, 0, 1, -start])  # -start: positions are not offsets
    for check_crc in (False, True):
        assert_same(
            data,
            start,
            len(data),
            base,
            max_record_bytes=rnd.choice([91, 200, 1 << 20]),
            check_crc=check_crc,
        )


def test_a_non_utf8_topic_or_a_wrong_crc_stops_both_at_the_same_record() -> None:
    first = make_record(0, b"a" * 10)
    bad_topic = bytearray(make_record(len(first), b"b" * 10, topic="XY"))
    bad_topic[88 + 10 + 1] = 0xFF  # the topic's first byte: not UTF-8
    data = first + bytes(bad_topic)
    assert assert_same(data, 0, len(data), 0, max_record_bytes=1 << 20) == len(first)
    wrong_crc = bytearray(make_record(len(first), b"c" * 10))
    wrong_crc[8] ^= 1
    data = first + bytes(wrong_crc)
    stop = assert_same(data, 0, len(data), 0, max_record_bytes=1 << 20, check_crc=False)
    assert stop == len(data)
    stop = assert_same(data, 0, len(data), 0, max_record_bytes=1 << 20, check_crc=True)
    assert stop == len(first)


@pytest.mark.parametrize("window", [0, 1, 91, 200, 1000, 1 << 40])
def test_every_window_takes_the_same_records(window: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(window)
    data, _ = random_stream(rnd, 40, blanks=False)
    monkeypatch.setattr(batch_module, "_WALK_WINDOW", window)
    assert_same(data, 0, len(data), 0, max_record_bytes=1 << 20)


def test_empty_and_short_ranges_take_nothing() -> None:
    record = make_record(0, b"z")
    for end in range(len(record) + 1):
        assert_same(record, 0, end, 0, max_record_bytes=1 << 20)
    assert assert_same(b"", 0, 0, 0, max_record_bytes=1 << 20) == 0


def test_a_range_outside_the_buffer_is_refused_by_both() -> None:
    record = make_record(0, b"z")
    for start, end in ((0, len(record) + 1), (-1, len(record)), (5, 4)):
        for compiled in (False, True):
            with pytest.raises(ValueError, match="start <= end <= len"):
                scanned(compiled, record, start, end, 0, max_record_bytes=1 << 20)


@pytest.mark.parametrize("count", [1024, 1025, 2100])
def test_a_stream_past_the_first_1024_positions_scans_the_same(count: int) -> None:
    """The compiled scan's position arrays start at 1,024 entries and double: a stream
    that fills them exactly, and ones that grow them once and twice, take every record."""
    data = bytearray()
    for index in range(count):
        data += make_record(len(data), b"m" * (index % 7), topic=("A", "Topic")[index % 2])
    stream = bytes(data)
    assert assert_same(stream, 0, len(stream), 0, max_record_bytes=1 << 20) == len(stream)


def test_integer_columns_are_int64_arrays_compiled_and_lists_in_the_reference() -> None:
    """The compiled scan answers each integer column as an array('q') (8 bytes a value,
    no int object a record: docs/performance.md "The scan's integer columns"), its
    reference as a list, the topics as a list in both; the values equal, sizes over 256
    and timestamps repeating or not."""
    assert ccore is not None
    data = bytearray()
    for index in range(6):
        body = b"m" * (300 if index < 4 else 301)
        data += make_record(len(data), body, store_ms=(7_000_000 if index < 3 else 7_000_001))
    stream = bytes(data)
    stop, *columns = ccore.scan_v4_run(stream, 0, len(stream), 0, 1 << 20, True, 1 << 20)
    reference = V4RunScanner(1 << 20).scan(stream, 0, len(stream), 0, 1 << 20)
    ref_stop, *ref_columns = reference
    assert stop == ref_stop == len(stream)
    for index, (column, ref_column) in enumerate(zip(columns, ref_columns, strict=True)):
        assert type(ref_column) is list and len(column) == 6
        if index == 7:  # the topics
            assert type(column) is list and column == ref_column
        else:
            assert type(column) is array and column.typecode == "q"
            assert column.tolist() == ref_column
    positions, sizes, stamps = reference[1], reference[3], reference[7]
    assert [p + s for p, s in zip(positions, sizes, strict=True)] == [*positions[1:], len(stream)]
    assert sizes[0] == sizes[3] != sizes[4] == sizes[5]
    assert stamps == [7_000_000] * 3 + [7_000_001] * 3


def test_a_scan_that_takes_nothing_answers_empty_columns() -> None:
    assert ccore is not None
    stream = make_record(0, b"x")[:50]  # not a whole record
    compiled = ccore.scan_v4_run(stream, 0, len(stream), 0, 1 << 20, True, 1 << 20)
    assert compiled == (0, *([array("q")] * 7), [], array("q"))
    assert V4RunScanner(1 << 20).scan(stream, 0, len(stream), 0, 1 << 20) == (0, *([[]] * 9))

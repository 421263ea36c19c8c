"""put_key_batch_python (the index put's pure-Python twin, tide/format/_index_put.py)
writes what tide.format.put_keys writes."""

from __future__ import annotations

import random
from array import array

import pytest

from tide.format import IndexGeometry, put_keys, read_index_header
from tide.format._index_put import _runs, _swapped, _SwappedNumbers
from tide.format._index_put import put_key_batch_python as put_key_batch


def _random_batches(rnd: random.Random, geometry: IndexGeometry, damaged: bool) -> None:
    """A few batches into the same file through both functions: same result, same bytes."""
    ours = bytearray(geometry.file_bytes)
    if damaged:  # slots naming entries the header does not count, negative, or garbage
        for _ in range(rnd.randrange(1, 6)):
            pos = rnd.randrange(40, geometry.entries_start) & ~3
            ours[pos : pos + 4] = rnd.randrange(-5, 60).to_bytes(4, "big", signed=True)
    theirs = bytearray(ours)
    offset = rnd.randrange(1 << 40)
    stamp = rnd.choice([0, 1_700_000_000_000 + rnd.randrange(10**6)])
    for _ in range(rnd.randrange(1, 6)):
        count = rnd.randrange(1, 60)
        hashes = [rnd.choice([rnd.randrange(1 << 31), rnd.randrange(5)]) for _ in range(count)]
        offsets: list[int] = []
        stamps: list[int] = []
        for _ in range(count):
            offset += rnd.randrange(300)
            offsets.append(offset)
            if stamp and rnd.random() < 0.2:  # runs of one time; now and then back in time
                stamp += rnd.choice([1, 999, 1000, 5000, -3000])
            stamps.append(stamp)
        assert put_key_batch(ours, geometry, hashes, offsets, stamps) == put_keys(
            theirs, geometry, hashes, offsets, stamps
        )
        assert ours == theirs


@pytest.mark.parametrize("seed", range(40))
def test_random_batches_write_what_put_keys_writes(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(25):
        geometry = IndexGeometry(rnd.choice([1, 3, 17, 1000]), rnd.choice([2, 5, 50, 400]))
        _random_batches(rnd, geometry, damaged=False)


@pytest.mark.parametrize("seed", range(40))
def test_damaged_slots_write_what_put_keys_writes(seed: int) -> None:
    rnd = random.Random(1000 + seed)
    for _ in range(25):
        geometry = IndexGeometry(rnd.choice([3, 17, 1000]), rnd.choice([5, 50, 400]))
        _random_batches(rnd, geometry, damaged=True)


def test_a_full_file_takes_what_fits_and_then_nothing() -> None:
    geometry = IndexGeometry(1000, 10)
    ours, theirs = bytearray(geometry.file_bytes), bytearray(geometry.file_bytes)
    hashes, offsets, stamps = list(range(100, 120)), list(range(20)), [5_000] * 20
    assert put_key_batch(ours, geometry, hashes, offsets, stamps) == 9
    assert put_keys(theirs, geometry, hashes, offsets, stamps) == 9
    assert ours == theirs
    assert put_key_batch(ours, geometry, hashes, offsets, stamps) == 0
    assert read_index_header(ours).index_count == 10


def test_swapped_numbers_from_blocks() -> None:
    numbers = _SwappedNumbers()
    for first, count in [(1, 10), (5, 100), (70_000, 8_600), (3, 1 << 17), (2**31 - 9_000, 100)]:
        expected = _swapped(array("I", range(first, first + count)))
        assert numbers.swapped(first, count) == expected


def test_runs_of_timestamps() -> None:
    assert _runs([5, 5, 5, 7, 7, 9]) == [(5, 3), (7, 2), (9, 1)]
    assert _runs([5, 7, 5]) is None  # not sorted
    assert _runs(list(range(100))) is None  # too many runs


def test_keys_sharing_slots_are_chained_without_tide_format(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random keys put many to a slot: the same bytes as put_keys, on the fast path."""
    rnd = random.Random(77)
    geometry = IndexGeometry(50, 2_000)
    ours, theirs = bytearray(geometry.file_bytes), bytearray(geometry.file_bytes)
    batches = []
    offset = 0
    for _ in range(10):
        count = rnd.randrange(1, 200)
        hashes = [rnd.randrange(1 << 31) for _ in range(count)]
        offsets = list(range(offset, offset + count * 10, 10))
        offset += count * 10
        batches.append((hashes, offsets, [1_700_000_000_000 + o for o in offsets]))
    for hashes, offsets, stamps in batches:
        put_keys(theirs, geometry, hashes, offsets, stamps)

    def refused(*args: object, **kwargs: object) -> int:
        raise AssertionError("tide.format.put_keys was called")

    monkeypatch.setattr("tide.format._index_put.put_keys", refused)
    for hashes, offsets, stamps in batches:
        put_key_batch(ours, geometry, hashes, offsets, stamps)
    assert ours == theirs

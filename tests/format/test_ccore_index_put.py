"""The index put in the compiled core (``_ccore.put_index_keys``, through
``tide.format.put_key_batch``) against its pure-Python twin (``put_key_batch_python``):
the same count and the same file bytes, batch after batch into one file, on random keys,
hash collisions, full files, damaged slots, torn puts and odd headers; both write what
one ``put_key`` (RocketMQ's ``IndexFile.putKey``) per key writes. Run on the
pure-Python path too (Makefile PURE_PYTHON_TESTS), where ``put_key_batch`` is the twin
and the checks against ``put_key`` / ``put_keys`` still bite."""

from __future__ import annotations

import mmap
import os
import random
import struct
import tempfile
from array import array
from collections.abc import Iterator

import pytest

from tide.format import (
    INDEX_HEADER_BYTES,
    IndexGeometry,
    _core,
    index_key,
    index_key_hashes,
    init_index_header,
    put_key,
    put_key_batch,
    put_keys,
    read_index_header,
    select_phy_offsets,
)
from tide.format._index_put import PutIndexKeys, put_key_batch_python

compiled = pytest.mark.skipif(_core.ccore is None, reason="the compiled core is not built or off")
BASE_MS = 1_700_000_000_000
Columns = tuple[list[int], list[int], list[int]]


def _columns(rnd: random.Random, count: int, offset: int, stamp: int) -> Columns:
    """Key hashes (random, a few shared, a few repeated), rising offsets, stamps in runs."""
    hashes = [
        rnd.choice([rnd.randrange(1 << 31), rnd.randrange(7), (1 << 31) - 1]) for _ in range(count)
    ]
    offsets, stamps = [], []
    for _ in range(count):
        offset += rnd.randrange(1, 300)
        offsets.append(offset)
        if stamp and rnd.random() < 0.2:  # now and then a new ms, a jump, or back in time
            stamp += rnd.choice([1, 999, 1000, 5000, -3000, 1 << 45])
        stamps.append(stamp)
    return hashes, offsets, stamps


def _damage(rnd: random.Random, buf: bytearray, geometry: IndexGeometry) -> None:
    """Slots naming uncounted, negative or garbage entries; entries with odd links; a
    header whose count is 0 or negative (read as 1) or past the end."""
    for _ in range(rnd.randrange(1, 8)):
        pos = rnd.randrange(INDEX_HEADER_BYTES, geometry.entries_start) & ~3
        buf[pos : pos + 4] = struct.pack(">i", rnd.randrange(-5, geometry.max_entries + 5))
    for _ in range(rnd.randrange(4)):
        number = rnd.randrange(geometry.max_entries)
        pos = geometry.entry_position(number) + 16
        buf[pos : pos + 4] = struct.pack(">i", rnd.randrange(-3, geometry.max_entries + 3))
    if rnd.random() < 0.3:
        count = rnd.choice([0, -1, -(1 << 31), geometry.max_entries, geometry.max_entries + 9])
        buf[36:40] = struct.pack(">i", count)


def _compiled_put() -> PutIndexKeys:
    assert _core.ccore is not None
    put: PutIndexKeys = _core.ccore.put_index_keys
    return put


def _both(
    python_buf: bytearray, compiled_buf: bytearray, geometry: IndexGeometry, columns: Columns
) -> int:
    put = _compiled_put()
    from_arrays = bytearray(compiled_buf)  # the same put, the columns as array('q')
    expected = put_key_batch_python(python_buf, geometry, *columns)
    got = put(compiled_buf, geometry.slot_count, geometry.max_entries, *columns, -1)
    assert got == expected
    assert compiled_buf == python_buf
    hashes, offsets, stamps = (array("q", column) for column in columns)
    assert (
        put(from_arrays, geometry.slot_count, geometry.max_entries, hashes, offsets, stamps, -1)
        == got
    )
    assert from_arrays == compiled_buf
    return got


def _batches(rnd: random.Random, geometry: IndexGeometry, damaged: bool) -> None:
    ours = bytearray(geometry.file_bytes)
    offset, stamp = rnd.randrange(1 << 40), rnd.choice([0, BASE_MS + rnd.randrange(10**6)])
    if rnd.random() < 0.5:  # a file after a full one: begin values from its end
        init_index_header(ours, offset, stamp - rnd.choice([0, 999, 1000, 70_000]))
    if damaged:
        _damage(rnd, ours, geometry)
    theirs = bytearray(ours)
    for _ in range(rnd.randrange(1, 6)):
        columns = _columns(rnd, rnd.randrange(0, 80), offset, stamp)
        _both(theirs, ours, geometry, columns)
        if columns[1]:
            offset, stamp = columns[1][-1], columns[2][-1]
        if damaged and rnd.random() < 0.3:  # a crash between slots and header: torn puts
            header = read_index_header(ours)
            back = struct.pack(">i", max(1, header.index_count - rnd.randrange(1, 4)))
            ours[36:40] = theirs[36:40] = back


@compiled
@pytest.mark.parametrize("seed", range(30))
def test_random_batches_same_bytes_as_the_python_twin(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(20):
        geometry = IndexGeometry(rnd.choice([1, 3, 17, 1000]), rnd.choice([2, 5, 50, 400]))
        _batches(rnd, geometry, damaged=False)


@compiled
@pytest.mark.parametrize("seed", range(30))
def test_damaged_and_torn_files_same_bytes_as_the_python_twin(seed: int) -> None:
    rnd = random.Random(5000 + seed)
    for _ in range(20):
        geometry = IndexGeometry(rnd.choice([1, 3, 17, 1000]), rnd.choice([2, 5, 50, 400]))
        _batches(rnd, geometry, damaged=True)


@compiled
@pytest.mark.parametrize("link", [-1, 0, 1, 2, 3, 4, 99])
def test_a_torn_put_keeps_the_older_chain(link: int) -> None:
    """A crash after entry 3's slot was written but before the header counted it: the
    slot names entry 3, whose link (the older chain, or itself, or garbage) is kept
    only when it names an older entry."""
    geometry = IndexGeometry(5, 50)
    ours = bytearray(geometry.file_bytes)
    put_key_batch_python(ours, geometry, [10, 15], [100, 200], [BASE_MS, BASE_MS])
    ours[geometry.slot_position(0) : geometry.slot_position(0) + 4] = struct.pack(">i", 3)
    entry = geometry.entry_position(3)
    ours[entry : entry + 20] = struct.pack(">iqii", 20, 300, 0, link)
    theirs = bytearray(ours)
    _both(theirs, ours, geometry, ([25, 5, 30], [400, 500, 600], [BASE_MS] * 3))
    links = [struct.unpack_from(">i", ours, geometry.entry_position(n) + 16)[0] for n in (3, 4)]
    assert links == [link if 0 < link < 3 else 0, 3]


@compiled
def test_one_slot_holds_the_whole_file_as_one_chain() -> None:
    geometry = IndexGeometry(1, 300)
    ours, theirs = bytearray(geometry.file_bytes), bytearray(geometry.file_bytes)
    rnd = random.Random(3)
    put = 0
    while put < geometry.capacity:
        put += _both(theirs, ours, geometry, _columns(rnd, 97, put * 1000, BASE_MS))
    assert read_index_header(ours).index_count == geometry.max_entries
    assert _both(theirs, ours, geometry, _columns(rnd, 5, 1 << 30, BASE_MS)) == 0


@pytest.fixture
def mapped_pair() -> Iterator[tuple[IndexGeometry, list[tuple[int, mmap.mmap]]]]:
    geometry = IndexGeometry(17, 200)
    with tempfile.TemporaryDirectory() as directory:
        pairs = []
        for name in ("python", "compiled"):
            fd = os.open(os.path.join(directory, name), os.O_RDWR | os.O_CREAT)
            os.ftruncate(fd, geometry.file_bytes)
            pairs.append((fd, mmap.mmap(fd, geometry.file_bytes)))
        yield geometry, pairs
        for fd, mm in pairs:
            mm.close()
            os.close(fd)


@compiled
def test_entries_through_the_file_descriptor_same_file(
    mapped_pair: tuple[IndexGeometry, list[tuple[int, mmap.mmap]]],
) -> None:
    geometry, [(python_fd, python_mm), (compiled_fd, compiled_mm)] = mapped_pair
    put = _compiled_put()
    rnd = random.Random(11)
    for _ in range(5):
        columns = _columns(rnd, 60, rnd.randrange(1 << 40), BASE_MS)
        expected = put_key_batch_python(python_mm, geometry, *columns, fd=python_fd)
        assert (
            put(compiled_mm, geometry.slot_count, geometry.max_entries, *columns, compiled_fd)
            == expected
        )
    assert compiled_mm[:] == python_mm[:]
    assert read_index_header(compiled_mm).index_count == geometry.max_entries


@compiled
def test_bad_input_is_refused_before_anything_is_written() -> None:
    geometry = IndexGeometry(17, 50)
    put = _compiled_put()
    buf = bytearray(geometry.file_bytes)
    with pytest.raises(ValueError, match="geometry needs"):
        put(buf[:-1], geometry.slot_count, geometry.max_entries, [1], [2], [3], -1)
    with pytest.raises(ValueError, match="differ in length"):
        put(buf, geometry.slot_count, geometry.max_entries, [1, 2], [2], [3], -1)
    with pytest.raises(ValueError, match="key hash -1 at 1"):
        put(buf, geometry.slot_count, geometry.max_entries, [1, -1], [2, 2], [3, 3], -1)
    with pytest.raises(TypeError):
        put(bytes(buf), geometry.slot_count, geometry.max_entries, [1], [2], [3], -1)  # type: ignore[arg-type]
    assert buf == bytearray(geometry.file_bytes)


@pytest.mark.parametrize("seed", range(6))
def test_what_one_put_key_per_key_writes(seed: int) -> None:
    """RocketMQ's IndexFile.putKey, key by key (tide.format.put_key), against the batch
    put of this path, on string keys (same keys again, shared slots) into a small file."""
    rnd = random.Random(900 + seed)
    geometry = IndexGeometry(rnd.choice([1, 13, 500]), 120)
    one_by_one, batched = bytearray(geometry.file_bytes), bytearray(geometry.file_bytes)
    keys = [index_key("TopicTest", f"k{rnd.randrange(40)}") for _ in range(150)]
    offsets = [1000 * (i + 1) for i in range(len(keys))]
    stamps = [BASE_MS + 250 * i for i in range(len(keys))]
    took = sum(
        put_key(one_by_one, geometry, key, offset, stamp)
        for key, offset, stamp in zip(keys, offsets, stamps, strict=True)
    )
    hashes = index_key_hashes([key.encode() for key in keys])
    assert put_key_batch(batched, geometry, hashes[:70], offsets[:70], stamps[:70]) == 70
    assert put_key_batch(batched, geometry, hashes[70:], offsets[70:], stamps[70:]) == took - 70
    assert batched == one_by_one
    newest = max(i for i, key in enumerate(keys[:took]) if key == keys[0])
    found = select_phy_offsets(batched, geometry, keys[0], 64, 0, 1 << 62)
    assert found[0] == offsets[newest]
    assert found == sorted(found, reverse=True)


@pytest.mark.parametrize("seed", range(10))
def test_selected_put_writes_what_put_keys_writes(seed: int) -> None:
    rnd = random.Random(300 + seed)
    geometry = IndexGeometry(rnd.choice([3, 1000]), rnd.choice([5, 400]))
    ours = bytearray(geometry.file_bytes)
    _damage(rnd, ours, geometry)
    theirs = bytearray(ours)
    for _ in range(4):
        columns = _columns(rnd, rnd.randrange(1, 60), rnd.randrange(1 << 40), BASE_MS)
        assert put_key_batch(ours, geometry, *columns) == put_keys(theirs, geometry, *columns)
        assert ours == theirs

"""The dispatch's batch put into an index file: :func:`put_keys`, cheaper.

:func:`put_key_batch` runs the compiled core's ``put_index_keys`` (tide/format/_ccore.c:
one C pass per batch) unless the pure-Python path runs (``TIDE_NO_EXTENSIONS=1``, or the
core did not import: tide.format._core); :func:`put_key_batch_python` is its pure-Python
twin, held byte-identical to it by tests/format/test_ccore_index_put.py.

The Python twin: same bytes, same result as ``put_keys``: the common case of a batch
(each slot empty or naming an older entry) is written here with a handful of C-level
passes per batch instead of an object or two per key; anything else (a slot naming an
entry the header does not count: a torn put) is left to ``put_keys``. What is cheaper:

* the entries are assembled column-wise: each 20-byte entry is five big-endian 32-bit
  words (hash, offset high, offset low, time, previous entry), written with one strided
  memoryview assignment per word from arrays, rather than one ``struct.pack`` per entry;
* the slots' old values are read once as raw words: they are the entries' "previous"
  words as they stand (big-endian), and are byte-swapped only to be checked;
* keys of the batch that share a slot (with random keys, a batch of 8,600 keys into 5
  million slots has ~7 such pairs) link to each other: only the keys of those slots,
  found with C-level passes, take a Python step each (``tide.format`` takes one per key
  of the whole batch then, ~3x the cost);
* the entries' times: store timestamps come sorted (commitlog order) in runs of equal
  values (a producer's batch is stored in one millisecond), so a time is computed per
  run (found by bisection and checked against the column) rather than per entry.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import getitem, mod, ne, setitem
from typing import cast

from tide.format import _core
from tide.format._consume_queue import WritableBuffer
from tide.format._index_file import (
    HASH_SLOT_BYTES,
    INDEX_ENTRY_BYTES,
    INDEX_HEADER_BYTES,
    IndexGeometry,
    put_keys,
    read_index_header,
    time_diff_seconds,
    write_index_header,
)
from tide.format._index_file import IndexHeader as _Header

_LITTLE = sys.byteorder == "little"
_WORDS = INDEX_ENTRY_BYTES // 4  # an entry: hash, offset (2 words), time, previous
_MAX_TIME_RUNS = 64  # more distinct timestamps in a batch: one time per entry
# ``table[i]`` and ``table[i] = v`` on an int memoryview, as functions for map
_get_int = cast("Callable[[memoryview, int], int]", getitem)
_set_int = cast("Callable[[memoryview, int, int], None]", setitem)


PutIndexKeys = Callable[
    [WritableBuffer, int, int, Sequence[int], Sequence[int], Sequence[int], int], int
]
# The compiled put, or None when the pure-Python path runs (a module attribute, so that
# bench.dispatch_apply can turn it off for its A/B rounds).
compiled_put: PutIndexKeys | None = None if _core.ccore is None else _core.ccore.put_index_keys


def put_key_batch(
    buf: WritableBuffer,
    geometry: IndexGeometry,
    key_hashes: Sequence[int],
    phy_offsets: Sequence[int],
    store_timestamps_ms: Sequence[int],
    *,
    fd: int | None = None,
) -> int:
    """:func:`put_keys` (same arguments, bytes and result): the keys into the index file
    ``buf``; how many were put, from the first (fewer when the file is full). ``fd``: the
    file ``buf`` maps, the entries are then written with ``pwrite`` on it."""
    put = compiled_put
    if put is None:
        return put_key_batch_python(
            buf, geometry, key_hashes, phy_offsets, store_timestamps_ms, fd=fd
        )
    return put(
        buf,
        geometry.slot_count,
        geometry.max_entries,
        key_hashes,
        phy_offsets,
        store_timestamps_ms,
        -1 if fd is None else fd,
    )


def put_key_batch_python(
    buf: WritableBuffer,
    geometry: IndexGeometry,
    key_hashes: Sequence[int],
    phy_offsets: Sequence[int],
    store_timestamps_ms: Sequence[int],
    *,
    fd: int | None = None,
) -> int:
    """:func:`put_key_batch`'s pure-Python twin (same arguments, bytes and result)."""
    if len(buf) < geometry.file_bytes:
        return put_keys(buf, geometry, key_hashes, phy_offsets, store_timestamps_ms, fd=fd)
    header = read_index_header(buf)
    first = header.index_count
    count = min(len(key_hashes), geometry.max_entries - first)
    if count <= 0:
        return 0
    if count < len(key_hashes):
        key_hashes, phy_offsets = key_hashes[:count], phy_offsets[:count]
        store_timestamps_ms = store_timestamps_ms[:count]
    slots = list(map(mod, key_hashes, repeat(geometry.slot_count)))
    if _put(buf, geometry, header, slots, key_hashes, phy_offsets, store_timestamps_ms, fd):
        return count
    return put_keys(buf, geometry, key_hashes, phy_offsets, store_timestamps_ms, fd=fd)


def _put(
    buf: WritableBuffer,
    geometry: IndexGeometry,
    header: _Header,
    slots: list[int],
    key_hashes: Sequence[int],
    phy_offsets: Sequence[int],
    stamps: Sequence[int],
    fd: int | None,
) -> bool:
    """Put the keys; False (nothing written) when a slot's old value is not an older
    entry nor empty."""
    first = header.index_count
    count = len(slots)
    slot_end = INDEX_HEADER_BYTES + HASH_SLOT_BYTES * geometry.slot_count
    with (
        memoryview(buf) as raw,
        raw[INDEX_HEADER_BYTES:slot_end] as region,
        region.cast("I") as table,  # native order: the values read byte-swapped
    ):
        olds = array("I", list(map(_get_int, repeat(table), slots)))  # big-endian words
        # (unsigned: a negative value is above any entry number too)
        if max(_swapped(olds)) >= first:
            return False
        prevs, fresh = olds, olds.count(0)
        if len(set(slots)) != count:
            prevs, fresh = _chained(slots, olds, first)
        entries = _entries(key_hashes, phy_offsets, _time_diffs(header, first, stamps), prevs)
        start = geometry.entry_position(first)
        if fd is None:
            raw[start : start + len(entries)] = entries
        elif os.pwrite(fd, entries, start) != len(entries):  # pragma: no cover
            raise OSError(f"short write of {len(entries)} index entry bytes at {start}")
        # (in order: the last key of a shared slot is the one it names)
        deque(map(_set_int, repeat(table), slots, _NUMBERS.swapped(first, count)), maxlen=0)
    head_first = first <= 1
    write_index_header(
        buf,
        _Header(
            stamps[0] if head_first else header.begin_timestamp_ms,
            stamps[-1],
            phy_offsets[0] if head_first else header.begin_phy_offset,
            phy_offsets[-1],
            header.hash_slot_count + fresh,
            first + count,
        ),
    )
    return True


def _chained(slots: list[int], olds: array[int], first: int) -> tuple[array[int], int]:
    """The previous entry of each key (big-endian words) when keys of the batch share
    slots: a key after the first of its slot links to the one before it, as one
    ``put_key`` after another would. And how many slots go from empty to used."""
    count = len(slots)
    last_of_slot = dict(zip(slots, range(count), strict=True))
    not_last = compress(range(count), map(ne, map(last_of_slot.__getitem__, slots), range(count)))
    shared = {slots[index] for index in not_last}
    prevs = array("I", olds)
    fresh = olds.count(0)
    latest: dict[int, int] = {}
    for index in compress(range(count), map(shared.__contains__, slots)):
        slot = slots[index]
        earlier = latest.get(slot)
        if earlier is not None:
            prevs[index] = int.from_bytes((first + earlier).to_bytes(4, "big"), sys.byteorder)
            fresh -= olds[index] == 0  # (an empty slot is counted at its first key)
        latest[slot] = index
    return prevs, fresh


class _SwappedNumbers:
    """Entry numbers as byte-swapped words (what a slot holds, read natively), from a
    block of consecutive numbers (batch after batch asks for the next ones). A block is
    made from big-endian bytes, every number at once: ``first`` in every 32-bit lane of
    a big integer, plus the lanes 0, 1, 2... (no carry: the numbers are below 2^31)."""

    _BLOCK = 1 << 16

    def __init__(self) -> None:
        # (first number, words): replaced as one, so that threads may share the cache
        self._block: tuple[int, array[int]] = (0, array("I"))
        self._ones = 0
        self._ramp = 0

    def swapped(self, first: int, count: int) -> array[int]:
        start, words = self._block
        offset = first - start
        if offset < 0 or offset + count > len(words):
            words = self._make(first, max(count, self._BLOCK))
            self._block = (first, words)
            offset = 0
        return words[offset : offset + count]

    def _make(self, first: int, count: int) -> array[int]:
        if count != self._BLOCK:  # (a batch larger than a block)
            return _swapped(array("I", range(first, first + count)))
        if not self._ones:
            self._ones = int.from_bytes(b"\0\0\0\1" * count, "big")
            self._ramp = int.from_bytes(struct.pack(f">{count}I", *range(count)), "big")
        words = array("I")
        words.frombytes((self._ones * first + self._ramp).to_bytes(4 * count, "big"))
        return words


def _swapped(values: array[int]) -> array[int]:
    """Native <-> big-endian 32-bit words (a copy on a little-endian machine)."""
    if not _LITTLE:
        return values
    out = array(values.typecode, values)
    out.byteswap()
    return out


def _entries(
    key_hashes: Sequence[int],
    phy_offsets: Sequence[int],
    times: array[int],
    prevs_big_endian: array[int],
) -> bytearray:
    """The entries' bytes, one strided word assignment per field."""
    count = len(key_hashes)
    hashes = array("I", key_hashes)
    offsets = array("q", phy_offsets)
    if _LITTLE:
        hashes.byteswap()
        offsets.byteswap()
    out = bytearray(INDEX_ENTRY_BYTES * count)
    with (
        memoryview(out) as raw,
        raw.cast("I") as words,
        memoryview(offsets) as offsets_view,
        offsets_view.cast("B") as offsets_bytes,
        offsets_bytes.cast("I") as offset_words,  # each offset: high word, low word
    ):
        words[0::_WORDS] = hashes
        words[1::_WORDS] = offset_words[0::2]
        words[2::_WORDS] = offset_words[1::2]
        words[3::_WORDS] = times
        words[4::_WORDS] = prevs_big_endian
    return out


def _time_diffs(header: _Header, first: int, stamps: Sequence[int]) -> array[int]:
    """``time_diff_seconds`` of each entry (as ``tide.format.put_keys`` computes them),
    as big-endian words: against the header's begin time, which the very first entry of
    a file sets."""
    begin = header.begin_timestamp_ms
    diffs = array("I", [time_diff_seconds(stamps[0], begin)])
    if len(stamps) > 1:
        if first <= 1:
            begin = stamps[0]
        rest = list(stamps[1:])
        runs = _runs(rest) if begin > 0 else [(begin, len(rest))]
        if runs is None:
            diffs.extend(map(time_diff_seconds, rest, repeat(begin)))
        else:
            for value, length in runs:
                diffs += array("I", [time_diff_seconds(value, begin)]) * length
    return _swapped(diffs)


def _runs(values: list[int]) -> list[tuple[int, int]] | None:
    """``values`` as (value, length) runs when sorted with few distinct values (found by
    bisection, then checked against the whole column), else None."""
    runs: list[tuple[int, int]] = []
    rebuilt: list[int] = []
    start, total = 0, len(values)
    while start < total:
        if len(runs) == _MAX_TIME_RUNS:
            return None
        value = values[start]
        end = bisect_right(values, value, start)  # > start: values[start] == value
        runs.append((value, end - start))
        rebuilt += repeat(value, end - start)
        start = end
    return runs if rebuilt == values else None


_NUMBERS = _SwappedNumbers()  # (the one writer thread of each index uses it)

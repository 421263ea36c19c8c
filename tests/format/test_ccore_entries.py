"""Consume-queue entries' bytes in the compiled core (``_ccore.consume_queue_entries``,
through ``tide.format.pack_entries``) against the pure-Python twin
(``pack_entries_python``): the same bytes on random runs (one tag or many, one size or
many, lists or tuples), and where the compiled one declines (None: values that do not
fit, other types, lengths that differ) the twin's bytes or error. Run on the
pure-Python path too (Makefile PURE_PYTHON_TESTS), where ``pack_entries`` is the twin
and is checked against ``pack_entry`` of each entry."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest

from tide.format import _core, pack_entries, pack_entry
from tide.format._consume_queue import pack_entries_python

compiled = pytest.mark.skipif(_core.ccore is None, reason="the compiled core is not built or off")
I64 = (-(1 << 63), (1 << 63) - 1)
I32 = (-(1 << 31), (1 << 31) - 1)
Entries = Callable[[object, object, object], bytes | None]


def _compiled() -> Entries:
    assert _core.ccore is not None
    entries: Entries = _core.ccore.consume_queue_entries
    return entries


def _run(rnd: random.Random) -> tuple[list[int], list[int], list[int]]:
    count = rnd.choice([0, 1, 2, 15, 16, 17, rnd.randrange(1, 3000)])
    offset = rnd.choice([0, rnd.randrange(1 << 40), I64[1] - 10**6])
    offsets = [offset + 150 * i for i in range(count)]
    one_size, one_code = rnd.randrange(1, 5000), rnd.randrange(*I64)
    sizes = [one_size if rnd.random() < 0.7 else rnd.randrange(*I32) for _ in range(count)]
    codes = [one_code if rnd.random() < 0.7 else rnd.choice([0, -1, *I64]) for _ in range(count)]
    if rnd.random() < 0.5:  # one size, one tag: the twin's column path
        sizes, codes = [one_size] * count, [one_code] * count
    return offsets, sizes, codes


@compiled
@pytest.mark.parametrize("seed", range(40))
def test_random_runs_same_bytes_as_the_twin(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(10):
        offsets, sizes, codes = _run(rnd)
        want = pack_entries_python(offsets, sizes, codes)
        assert _compiled()(offsets, sizes, codes) == want
        assert _compiled()(tuple(offsets), tuple(sizes), tuple(codes)) == want


@compiled
@pytest.mark.parametrize(
    ("offsets", "sizes", "codes"),
    [
        ([1 << 63], [1], [0]),
        ([-(1 << 63) - 1], [1], [0]),
        ([1, 2], [1, 1 << 31], [0, 0]),
        ([1, 2], [1, -(1 << 31) - 1], [0, 0]),
        ([1], [1], [1 << 63]),
        ([1, 2, 3], [5, 5, 5], [0, 0, 1 << 64]),
    ],
)
def test_values_that_do_not_fit_are_left_to_the_twin(
    offsets: list[int], sizes: list[int], codes: list[int]
) -> None:
    assert _compiled()(offsets, sizes, codes) is None
    with pytest.raises((struct.error, OverflowError)) as twin:
        pack_entries_python(offsets, sizes, codes)
    with pytest.raises(type(twin.value)):
        pack_entries(offsets, sizes, codes)


@compiled
def test_other_input_is_left_to_the_twin() -> None:
    entries = _compiled()
    assert entries(iter([1]), [2], [3]) is None
    assert entries([1, 2], [2], [3, 4]) is None
    assert entries([True], [2], [3]) is None
    assert entries([1.0], [2], [3]) is None
    for args in (([True], [2], [3]), ([1, 2], [2], [3, 4])):
        assert pack_entries(*args) == pack_entries_python(*args)


@pytest.mark.parametrize("seed", range(5))
def test_selected_pack_is_pack_entry_of_each(seed: int) -> None:
    rnd = random.Random(100 + seed)
    offsets, sizes, codes = _run(rnd)
    want = b"".join(map(pack_entry, offsets, sizes, codes))
    assert pack_entries(offsets, sizes, codes) == want

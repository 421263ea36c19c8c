"""GetQueueEntries' span selection and where the consume queue's read stops, in the
compiled core (``_ccore.entry_spans`` and ``_ccore.first_unwritten``, through
``tide.format.select_spans`` and ``first_unwritten``) against their pure-Python twins
(``select_spans_python``, ``first_unwritten_python``): the same answer on random queues
(PRE_BLANKs, gaps, tag filters, byte and count limits), edge cases and damaged entries;
the same ValueError for a length that is not whole entries; and where the compiled
selection declines (None: tag codes or ints it does not take) the twin's answer. Run on
the pure-Python path too (Makefile PURE_PYTHON_TESTS), where the wrappers are the
twins."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection

import pytest

from tide.format import (
    PRE_BLANK_SIZE,
    Spans,
    _core,
    first_unwritten,
    pack_entries,
    select_spans,
)
from tide.format._consume_queue import first_unwritten_python
from tide.format._entry_spans import select_spans_python

compiled = pytest.mark.skipif(_core.ccore is None, reason="the compiled core is not built or off")
I64_MAX = 2**63 - 1
NO_CODES: frozenset[int] = frozenset()
Unit = tuple[int, int, int]
PRE_BLANK: Unit = (0, PRE_BLANK_SIZE, 0)
Args = tuple[bytes, int, int, Collection[int], int, int]
Select = Callable[[bytes, int, int, object, int, int], Spans | None]


def _compiled() -> Select:
    assert _core.ccore is not None
    select: Select = _core.ccore.entry_spans
    return select


def packed(units: list[Unit]) -> bytes:
    return pack_entries(*([list(c) for c in zip(*units, strict=True)] or [[], [], []]))


def queue(rnd: random.Random, count: int) -> list[Unit]:
    """``count`` entries as a consume queue holds them: records mostly back to back, some
    gaps, PRE_BLANKs, a few tags codes."""
    units: list[Unit] = []
    position = rnd.randrange(1 << 40)
    codes = [rnd.randrange(-(2**63), 2**63) for _ in range(4)]
    for _ in range(count):
        if rnd.random() < 0.05:
            units.append(PRE_BLANK)
            continue
        position += rnd.choice((0, 0, 0, 0, 7))
        size = rnd.randrange(1, 2000)
        units.append((position, size, rnd.choice(codes)))
        position += size
    return units


def random_args(rnd: random.Random) -> Args:
    units = queue(rnd, rnd.choice([0, 1, 2, 100, 1024, rnd.randrange(1, 1300)]))
    present = sorted({code for _, _, code in units})
    codes = frozenset(rnd.sample(present, min(len(present), rnd.randrange(3))))
    if rnd.random() < 0.2:
        codes |= {rnd.randrange(-(2**63), 2**63)}  # a tag no entry has
    first = rnd.choice([0, rnd.randrange(1 << 30), I64_MAX - 2000])
    max_count = rnd.choice([1, 32, 1024, rnd.randrange(1, 1500)])
    max_bytes = rnd.choice([0, 0, 1, rnd.randrange(1, 1 << 20), rnd.randrange(1 << 40)])
    return packed(units), first, max_count, codes, max_bytes, first


def both(*args: object) -> Spans:
    """The compiled answer, checked equal to the twin's (with lists of int tuples)."""
    twin = select_spans_python(*args)  # type: ignore[arg-type]
    answer = _compiled()(*args)  # type: ignore[arg-type]
    assert answer == twin
    assert answer is not None
    assert all(type(span) is tuple and len(span) == 3 for span in answer[0])
    return answer


@compiled
@pytest.mark.parametrize("seed", range(20))
def test_random_queues_same_answer_as_the_twin(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(25):
        entries, *rest = random_args(rnd)
        both(entries, *rest)
        both(bytearray(entries), *rest)
        both(memoryview(entries), *rest)


@compiled
@pytest.mark.parametrize("seed", range(5))
def test_damaged_entries_same_answer_as_the_twin(seed: int) -> None:
    """Entries no reader hands over (random bytes, negative offsets and sizes, records
    whose end is past 2**63) still get the twin's answer."""
    rnd = random.Random(1000 + seed)
    for _ in range(40):
        count = rnd.randrange(1, 200)
        entries = rnd.randbytes(20 * count)
        codes = frozenset(rnd.sample(range(-3, 3), 2)) if rnd.random() < 0.3 else NO_CODES
        both(entries, 5, rnd.randrange(1, 300), codes, rnd.choice((0, 1 << 33)), 5)
    edge = [(-1, 10, 0), (9, 5, 0), (I64_MAX - 3, 10, 0), (I64_MAX - 3, 7, 0), (-1, -5, 1)]
    edge += [(-(2**63), -(2**31), 0), (-(2**63), -1, 0), (-(2**63) - 1 + 2**31, 4, 0)]
    for start in range(len(edge)):
        both(packed(edge[start:]), 0, 100, NO_CODES, 0, 0)
        both(packed(edge[start:]), 0, 100, NO_CODES, 3, 0)


@pytest.mark.parametrize(
    ("units", "max_count", "codes", "max_bytes", "expected"),
    [
        ([], 32, NO_CODES, 0, ([], 40)),
        ([PRE_BLANK] * 5, 32, NO_CODES, 0, ([], 45)),
        ([PRE_BLANK, (100, 10, 1), PRE_BLANK], 32, NO_CODES, 0, ([(100, 10, 1)], 43)),
        ([(100, 10, 1), (110, 5, 2)], 32, frozenset({7}), 0, ([], 42)),
        ([(100, 10, 1), (110, 5, 2)], 32, NO_CODES, 3, ([(100, 10, 1)], 41)),
        ([(100, 10, 1), (110, 5, 2)], 1, NO_CODES, 0, ([(100, 10, 1)], 41)),
        (
            [(100, 10, 1), (110, 5, 2), (115, 1, 1)],
            32,
            frozenset({1}),
            0,
            ([(100, 10, 1), (115, 1, 1)], 43),
        ),
        ([(100, 10, 1), (111, 5, 2)], 32, NO_CODES, 15, ([(100, 10, 1), (111, 5, 1)], 42)),
        ([(0, PRE_BLANK_SIZE, 1)], 32, NO_CODES, 0, ([(0, PRE_BLANK_SIZE, 1)], 41)),
        ([(-1, 10, 0)], 32, NO_CODES, 0, ([(-1, 10, 1)], 41)),
    ],
)
def test_edge_cases(
    units: list[Unit], max_count: int, codes: frozenset[int], max_bytes: int, expected: Spans
) -> None:
    entries = packed(units)
    assert select_spans(entries, 40, max_count, codes, max_bytes, 40) == expected
    assert select_spans_python(entries, 40, max_count, codes, max_bytes, 40) == expected


@pytest.mark.parametrize("max_count", [1, 1024])
def test_max_count_of_a_pull(max_count: int) -> None:
    units = [(1000 + 50 * n, 50, n % 2) for n in range(2100)]
    entries = packed(units)
    want = ([(1000, 50 * max_count, max_count)], max_count)
    assert select_spans(entries, 0, max_count, NO_CODES, 0, 0) == want
    every_other = select_spans(entries, 0, max_count, frozenset({1}), 0, 0)
    assert every_other == ([(1050 + 100 * n, 50, 1) for n in range(max_count)], 2 * max_count)


@pytest.mark.parametrize("select", [select_spans, select_spans_python])
@pytest.mark.parametrize("length", [1, 19, 21, 39, 20 * 1024 + 7])
def test_a_length_not_whole_entries_is_refused(select: Callable[..., Spans], length: int) -> None:
    with pytest.raises(ValueError, match=f"entries of {length} bytes: not a multiple of 20"):
        select(bytes(length), 0, 32, NO_CODES, 0, 0)


@compiled
def test_a_length_not_whole_entries_is_refused_by_the_compiled_one() -> None:
    with pytest.raises(ValueError, match="entries of 21 bytes"):
        _compiled()(bytes(21), 0, 32, NO_CODES, 0, 0)


DECLINED: list[tuple[object, int, int, int]] = [
    (frozenset({1 << 64}), 0, 32, 0),  # a code over 64 bits
    (frozenset({-(1 << 63) - 1}), 0, 32, 0),
    (frozenset({1.0}), 0, 32, 0),  # not ints
    (frozenset({"1"}), 0, 32, 0),
    ([1], 0, 32, 0),  # not a set
    ((1, 2), 0, 32, 0),
    (frozenset(range(257)), 0, 32, 0),  # more codes than a pull's expression takes
    (NO_CODES, 1 << 63, 32, 0),  # ints that do not fit
    (NO_CODES, I64_MAX - 1, 32, 0),  # queue offsets past 2**63 - 1
    (NO_CODES, 0, 1 << 64, 0),
    (NO_CODES, 0, 32, 1 << 64),
]


@compiled
@pytest.mark.parametrize(("codes", "first", "max_count", "max_bytes"), DECLINED)
def test_what_the_compiled_one_declines_the_twin_answers(
    codes: object, first: int, max_count: int, max_bytes: int
) -> None:
    entries = packed([(100, 10, 1), (110, 5, 2), (115, 3, 1)])
    assert _compiled()(entries, first, max_count, codes, max_bytes, first) is None
    args = (entries, first, max_count, codes, max_bytes, first)
    assert select_spans(*args) == select_spans_python(*args)  # type: ignore[arg-type]


@compiled
def test_tag_codes_as_python_compares_them() -> None:
    """Sets of ints the compiled one takes: bools are 0 and 1 (as in ``in``); set or
    frozenset; up to 256 codes, sorted or not."""
    entries = packed([(100, 10, 1), (110, 5, 0), (115, 3, -5), (118, 1, 1 << 62)])
    for codes in (
        frozenset({True}),
        {False, -5},
        frozenset(range(256)),
        frozenset(range(-255, 1)),
        frozenset({1 << 62, -(1 << 63), I64_MAX}),
        {1, 0, -5, 1 << 62},
    ):
        both(entries, 0, 32, codes, 0, 0)


# -- first_unwritten: where a read of the queue's entries stops -------------------------
@pytest.mark.parametrize("seed", range(5))
def test_first_unwritten_same_index_as_the_twin(seed: int) -> None:
    """Random runs of written entries with an unwritten one (offset < 0, size <= 0, all
    zeros) at a random place, or none; and random bytes."""
    rnd = random.Random(2000 + seed)
    unwritten = [(-1, 10, 0), (5, 0, 0), (5, -1, 0), (0, 0, 0), (-(2**63), -(2**31), 1)]
    for _ in range(60):
        units = queue(rnd, rnd.choice([0, 1, 50, 1024]))
        at = rnd.randrange(len(units) + 1)
        if at < len(units) and rnd.random() < 0.8:
            units[at] = rnd.choice(unwritten)
        data = packed(units)
        want = next((i for i, (o, s, _) in enumerate(units) if o < 0 or s <= 0), len(units))
        assert first_unwritten_python(data) == want
        assert first_unwritten(data) == want
        assert first_unwritten(memoryview(data)) == want
        noise = rnd.randbytes(20 * rnd.randrange(1, 30))
        assert first_unwritten(noise) == first_unwritten_python(noise)


@pytest.mark.parametrize("find", [first_unwritten, first_unwritten_python])
def test_first_unwritten_refuses_a_length_not_whole_entries(find: Callable[..., int]) -> None:
    assert find(b"") == 0
    with pytest.raises(ValueError, match="entries of 41 bytes: not a multiple of 20"):
        find(bytes(41))

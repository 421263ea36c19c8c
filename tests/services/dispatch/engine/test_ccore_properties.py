"""The compiled properties scan (``tide.format._ccore.dispatch_properties``) against its
Python reference (``batch_fields.properties_between_python``): equal columns for random
and damaged properties (the separators \\x00, \\x01, \\x02 anywhere, names cut short,
values with separators) and for the usual batches (one producer's names in one order).
Skipped when the extension is not built (tests/format/test_core_selection.py fails if it
should have been)."""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from itertools import accumulate

import pytest

from services.dispatch.engine.batch_fields import properties_between_python
from tide.format import _core, encode_properties
from tide.format._columns import PropertyColumns

pytestmark = pytest.mark.skipif(
    _core.dispatch_properties is None, reason="the compiled core is not built or is off"
)
PIECES = [b"KEYS", b"TAGS", b"UNIQ_KEY", b"KEY", b"UNIQ", b"x", b"\x00", b"\x01", b"\x02", b""]


def compiled(data: bytes, starts: Sequence[int], ends: Sequence[int]) -> PropertyColumns:
    assert _core.dispatch_properties is not None
    return _core.dispatch_properties(data, starts, ends)


def compiled_sized(
    data: bytes, starts: Sequence[int], positions: Sequence[int], sizes: Sequence[int]
) -> PropertyColumns:
    assert _core.ccore is not None
    columns: PropertyColumns = _core.ccore.dispatch_properties(data, starts, positions, sizes)
    return columns


def assert_same(props: list[bytes], gap: bytes = b"") -> None:
    """The properties laid out one after another (``gap`` between them, as the rest of
    a record lies between two records' properties) scanned both ways."""
    data = gap + gap.join(props)
    starts = list(accumulate((len(p) + len(gap) for p in props[:-1]), initial=len(gap)))
    ends = [start + len(p) for start, p in zip(starts, props, strict=True)]
    python = properties_between_python(data, starts, ends)
    assert compiled(data, starts, ends) == tuple(python), props
    # Given as records (the properties end where a record does): each end as a position
    # before the start (where a record's header would be) plus a size.
    positions = [max(0, start - 7) for start in starts]
    sizes = [end - position for end, position in zip(ends, positions, strict=True)]
    assert compiled_sized(data, starts, positions, sizes) == tuple(python), props
    # The batch's columns as the scan gives them (array('q')), and as another array kind
    # (read as a sequence): the same answer.
    for typecode in ("q", "l", "i"):
        a_starts, a_ends = array(typecode, starts), array(typecode, ends)
        assert compiled(data, a_starts, a_ends) == tuple(python), (typecode, props)
        a_positions, a_sizes = array(typecode, positions), array(typecode, sizes)
        assert compiled_sized(data, a_starts, a_positions, a_sizes) == tuple(python)


def random_properties(rnd: random.Random) -> bytes:
    return b"".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 12)))


@pytest.mark.parametrize("seed", range(300))
def test_random_and_damaged_properties_read_the_same(seed: int) -> None:
    rnd = random.Random(seed)
    props = [random_properties(rnd) for _ in range(rnd.randint(1, 20))]
    assert_same(props, gap=rnd.choice([b"", b"\x02", b"\x00zz"]))


@pytest.mark.parametrize("seed", range(50))
def test_usual_batches_read_the_same(seed: int) -> None:
    rnd = random.Random(seed)
    names = rnd.sample(["KEYS", "TAGS", "UNIQ_KEY", "DELAY", "WAIT"], rnd.randint(0, 5))
    props = [
        encode_properties({name: rnd.choice(["", "t", "a b", f"k{i}", "é"]) for name in names})
        for i in range(rnd.randint(1, 50))
    ]
    assert_same(props, gap=b"\xff\x00\x01")


def test_last_value_wins_and_empty_values_are_kept() -> None:
    props = [b"KEYS\x01a\x02KEYS\x01b\x02UNIQ_KEY\x01\x02", b"TAGS\x01\x01x\x02", b"KEYS"]
    assert_same(props)
    keys, tags, uniq = compiled(b"".join(props), [0, 24, 32], [24, 32, 36])
    assert keys == [b"b", b"", b""] and tags == [b"", b"\x01x", b""]
    assert uniq == [b"", None, None]


def test_no_records_and_bounds_outside_the_data() -> None:
    assert compiled(b"", [], []) == ([], [], [])
    with pytest.raises(ValueError, match="not inside the data"):
        compiled(b"KEYS\x01a", [0], [8])
    with pytest.raises(ValueError, match="2 starts but 1 ends"):
        compiled(b"KEYS\x01a", [0, 1], [2])
    # the sized form: an end past the data, a size that overflows, sizes of another length
    with pytest.raises(ValueError, match="not inside the data"):
        compiled_sized(b"KEYS\x01a", [0], [1], [7])
    with pytest.raises(ValueError, match="not inside the data"):
        compiled_sized(b"KEYS\x01a", [0], [1], [(1 << 63) - 1])
    with pytest.raises(ValueError, match="1 starts but 1 ends or sizes"):
        compiled_sized(b"KEYS\x01a", [0], [0], [1, 2])
    assert compiled_sized(b"xKEYS\x01a", [1], [0], [7]) == ([b"a"], [b""], [None])

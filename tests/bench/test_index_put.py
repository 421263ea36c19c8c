"""``bench.index_put``: its batches, and a put of them on each side (a small geometry, no
timing asserted: the figures are the benchmark's, docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from bench.index_put import RECORD_BYTES, batches, ns_a_key
from tide.format import _index_put
from tide.format._index_file import IndexGeometry


def test_batches_cut_the_keys_with_rising_offsets() -> None:
    columns = batches(1_000, 400, seed=1)
    assert [len(hashes) for hashes, _, _ in columns] == [400, 400, 200]
    offsets = [offset for _, column, _ in columns for offset in column]
    assert offsets == list(range(0, 1_000 * RECORD_BYTES, RECORD_BYTES))
    assert all(0 <= h < 2**31 for hashes, _, _ in columns for h in hashes)
    assert batches(1_000, 400, seed=1) == columns  # a round's keys are the same every run


@pytest.mark.parametrize("compiled", [True, False])
def test_every_key_is_put_and_timed(compiled: bool) -> None:
    if compiled and _index_put.compiled_put is None:
        pytest.skip("the compiled core is not built or is off")
    geometry = IndexGeometry(1_000, 5_000)
    assert ns_a_key(geometry, batches(3_000, 400, seed=2), compiled) > 0  # else it raises


def test_a_put_that_falls_short_is_an_error() -> None:
    geometry = IndexGeometry(1_000, 1_001)  # room for 1,000 keys
    with pytest.raises(RuntimeError, match="put 1000 keys of 1200"):
        ns_a_key(geometry, batches(1_200, 400, seed=3), compiled=False)

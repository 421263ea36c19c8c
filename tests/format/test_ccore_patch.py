"""The compiled lock-time patch (``tide.format._ccore.patch_run``) against its Python
reference (``patch_run_python``): the same bytes, the same offsets and the same queue
offset table, for random runs (IPv4 and IPv6 store hosts, transaction records without a
queue entry, queues met for the first time) and pieces of a run (memoryviews); and the
same refusal of sizes that do not add up to the run. Skipped when the extension is not
built (test_core_selection fails if it should have been)."""

from __future__ import annotations

import random

import pytest

from tests.format.test_ccore_run import V4, V6, random_run
from tide.format import RunWriter, _core, scan_run
from tide.format._record_run import patch_run_python

pytestmark = pytest.mark.skipif(
    _core.patch_run is None, reason="the compiled core is not built or is off"
)
Key = tuple[str, int] | None


def patched(compiled: bool, data: bytes, keys: list[Key], host: bytes, piece: slice) -> object:
    layout = scan_run(data, 4 << 20)
    buf = bytearray(data)
    table: dict[Key, int] = {("T", 1): 5, ("TopicTest", 0): 0}
    first, stop = piece.start or 0, piece.stop if piece.stop is not None else layout.count
    at = layout.starts[first] if first < layout.count else len(buf)
    end = layout.starts[stop] if stop < layout.count else len(buf)
    args = (
        memoryview(buf)[at:end],
        layout.sizes[first:stop],
        keys[first:stop],
        layout.store_timestamp_positions[first:stop],
        table,
        1 << 40,
        1_700_000_000_000,
        host,
    )
    assert _core.patch_run is not None
    result = _core.patch_run(*args) if compiled else patch_run_python(*args)
    return result, bytes(buf), table


@pytest.mark.parametrize("seed", range(80))
def test_random_runs_patch_the_same(seed: int) -> None:
    rnd = random.Random(seed)
    data = random_run(rnd)
    layout = scan_run(data, 4 << 20)
    keys: list[Key] = [
        None if rnd.random() < 0.1 else (topic.decode(), queue_id)
        for topic, queue_id in zip(layout.topics, layout.queue_ids, strict=True)
    ]
    host = rnd.choice([V4, V6])
    first = rnd.randrange(layout.count + 1)
    piece = rnd.choice([slice(None), slice(first, None), slice(0, first)])
    assert patched(True, data, keys, host, piece) == patched(False, data, keys, host, piece)


def test_sizes_that_do_not_add_up_are_refused_by_both() -> None:
    writer = RunWriter(V4)
    writer.add("T", b"T", 0, b"body", b"", 0, 0, 1)
    data = bytearray(writer.getvalue())
    for patch in (_core.patch_run, patch_run_python):
        assert patch is not None
        with pytest.raises(ValueError, match="the sizes add up to 0, the run is"):
            patch(data, [], [], [], {}, 0, 0, V4)

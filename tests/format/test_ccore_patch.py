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


def many_queues_run(count: int, queues: int) -> bytes:
    writer = RunWriter(V4)
    for index in range(count):
        writer.add("T", b"T", index % queues, b"body", b"", 0, 0, 1)
    return writer.getvalue()


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("queues", [1, 7, 32, 33, 90])
def test_queue_offsets_from_shared_and_equal_keys_are_the_same(shared: bool, queues: int) -> None:
    """The compiled patch keeps up to 32 queues' offsets in C (a key object the store
    passes once per queue is found by identity, an equal one by comparison); more queues
    than that go through the table directly. Every mix gives the reference's offsets and
    table, new queues inserted in the order met."""
    data = many_queues_run(200, queues)
    layout = scan_run(data, 4 << 20)
    one_per_queue: dict[int, Key] = {q: ("T", q) for q in range(queues)}
    rnd = random.Random(queues)
    keys: list[Key] = [
        one_per_queue[q] if shared or rnd.random() < 0.5 else ("T", q) for q in layout.queue_ids
    ]
    compiled, python = (patched(c, data, keys, V4, slice(None)) for c in (True, False))
    assert compiled == python
    assert list(compiled[2]) == list(python[2])  # type: ignore[index]


def test_a_refused_run_leaves_the_table_as_the_reference_does() -> None:
    """Sizes that do not add up are found after the records were patched: the table has
    moved past them in both (the compiled core writes its kept offsets back on errors)."""
    data = bytearray(many_queues_run(3, 2))
    layout = scan_run(data, 4 << 20)
    tables: list[dict[Key, int]] = []
    for patch in (_core.patch_run, patch_run_python):
        assert patch is not None
        table: dict[Key, int] = {("T", 1): 7}
        with pytest.raises(ValueError, match="the sizes add up to"):
            patch(
                data + b"x",
                layout.sizes,
                [("T", q) for q in layout.queue_ids],
                layout.store_timestamp_positions,
                table,
                0,
                0,
                V4,
            )
        tables.append(table)
    assert tables[0] == tables[1] == {("T", 1): 8, ("T", 0): 2}
    assert list(tables[0]) == list(tables[1])

"""The dispatch apply's per-batch columns in the compiled core (``_ccore.queue_entry_runs``,
``back_to_back_runs``) against their pure-Python twins in
``tide/format/_dispatch_columns.py``: equal answers on random batches (queues in runs,
round robin or at random, transaction records that take no entry, gaps in the queue
offsets, records back to back or not), on damaged and edge-case columns, and where the
compiled one declines (None) the twin answers through ``tide.format``'s function. Run on
the pure-Python path too (Makefile PURE_PYTHON_TESTS), where the public functions are
the twins and are checked against a plain per-record reading of the rule."""

from __future__ import annotations

import random
import struct
from array import array
from collections.abc import Callable
from typing import Any

import pytest

from tide.format import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    _core,
    back_to_back_runs,
    is_queue_less,
    pack_entry,
    queue_entry_runs,
)
from tide.format._dispatch_columns import (
    back_to_back_runs_python,
    queue_entry_runs_python,
    queue_runs_python,
    record_ends_python,
)

compiled = pytest.mark.skipif(_core.ccore is None, reason="the compiled core is not built or off")
I64 = (-(1 << 63), (1 << 63) - 1)
FLAGS = (0, SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)


def _core_fn(name: str) -> Callable[..., Any]:
    assert _core.ccore is not None
    fn: Callable[..., Any] = getattr(_core.ccore, name)
    return fn


def _batch(rnd: random.Random) -> dict[str, list[Any]]:
    """Columns of a random batch as the Tail's scan gives them (topics shared objects)."""
    count = rnd.choice([1, 2, 3, 99, 100, 101, rnd.randrange(1, 2000)])
    topics = [rnd.choice(["T", "orders", "SCHEDULE_TOPIC_XXXX", "ü"]) for _ in range(4)]
    queues = [(rnd.choice(topics), rnd.randrange(8)) for _ in range(rnd.randrange(1, 20))]
    shape = rnd.choice(["runs", "round-robin", "random"])
    run_length = rnd.choice([1, 7, 100])
    next_offsets = {queue: rnd.choice([0, rnd.randrange(1 << 40)]) for queue in queues}
    columns: dict[str, list[Any]] = {
        k: [] for k in ("topics", "ids", "flags", "qos", "offsets", "positions", "sizes")
    }
    offset, position = rnd.randrange(1 << 40), rnd.randrange(1000)
    for index in range(count):
        if shape == "runs":
            queue = queues[(index // run_length) % len(queues)]
        elif shape == "round-robin":
            queue = queues[index % len(queues)]
        else:
            queue = rnd.choice(queues)
        flag = rnd.choice(FLAGS) if rnd.random() < 0.05 else 0
        if rnd.random() < 0.02:  # a gap or a repeat in the queue's offsets
            next_offsets[queue] += rnd.choice([-1, 2, 5])
        size = rnd.randrange(100, 300)
        columns["topics"].append(queue[0])
        columns["ids"].append(queue[1])
        columns["flags"].append(flag)
        columns["qos"].append(next_offsets[queue])
        columns["offsets"].append(offset)
        columns["positions"].append(position)
        columns["sizes"].append(size)
        if not is_queue_less(flag):
            next_offsets[queue] += 1
        gap = rnd.choice([0] * 20 + [8, 1000])  # a blank marker, a joined record
        offset += size + gap
        position += size + (gap if rnd.random() < 0.5 else 0)
    columns["codes"] = [rnd.choice([0, 7, -1, I64[1]]) for _ in range(count)]
    return columns


def _norm(runs: list[Any] | None) -> list[Any] | None:
    """The reference's tuples as lists (the compiled core answers lists): equal item by
    item is what is asked of the two."""
    if runs is None:
        return None
    return [
        (topic, queue_id, qos if isinstance(qos, int) else list(qos), *map(list, columns))
        for topic, queue_id, qos, *columns in runs
    ]


def _queue_runs_args(c: dict[str, list[Any]]) -> tuple[list[Any], ...]:
    return (c["topics"], c["ids"], c["flags"], c["qos"], c["offsets"], c["sizes"], c["codes"])


def _queue_runs_by_record(c: dict[str, list[Any]]) -> list[Any]:
    """The rule read plainly: a dict of each queue's records, in the order first met."""
    groups: dict[tuple[str, int], list[int]] = {}
    for index, queue in enumerate(zip(c["topics"], c["ids"], strict=True)):
        groups.setdefault(queue, [])
        if not is_queue_less(c["flags"][index]):
            groups[queue].append(index)
    runs = []
    for (topic, queue_id), group in groups.items():
        if not group:
            continue
        qos = [c["qos"][i] for i in group]
        consecutive = len(qos) > 1 and qos == list(range(qos[0], qos[0] + len(qos)))
        runs.append(
            (
                topic,
                queue_id,
                qos[0] if consecutive else qos,
                [c["offsets"][i] for i in group],
                [c["sizes"][i] for i in group],
                [c["codes"][i] for i in group],
            )
        )
    return runs


@pytest.mark.parametrize("seed", range(60))
def test_random_batches_twins_and_the_rule_agree(seed: int) -> None:
    rnd = random.Random(seed)
    c = _batch(rnd)
    want = _queue_runs_by_record(c)
    assert _norm(queue_runs_python(*_queue_runs_args(c))) == want
    ends = [p + s for p, s in zip(c["positions"], c["sizes"], strict=True)]
    assert record_ends_python(c["positions"], c["sizes"]) == ends
    runs = back_to_back_runs_python(c["offsets"], c["positions"], c["sizes"])
    assert back_to_back_runs(c["offsets"], c["positions"], c["sizes"]) == runs
    # The runs cover every record, in order, each record inside exactly one run.
    assert sum(end - start for start, end, _ in runs) == sum(c["sizes"])
    assert runs[0][0] == c["offsets"][0]


@compiled
@pytest.mark.parametrize("seed", range(60))
def test_random_batches_compiled_equals_the_twin(seed: int) -> None:
    c = _batch(random.Random(seed))
    want = _norm_entries(queue_entry_runs_python(*_queue_runs_args(c)))
    assert want is not None
    got = _core_fn("queue_entry_runs")(*_queue_runs_args(c))
    assert got == want
    assert [type(run[2]) for run in got] == [type(run[2]) for run in want]
    assert _core_fn("back_to_back_runs")(
        c["offsets"], c["positions"], c["sizes"]
    ) == back_to_back_runs_python(c["offsets"], c["positions"], c["sizes"])
    # The integer columns as the Tail's scan gives them (array('q')): the same answers
    # from the compiled calls and from the twins.
    topics, *ints = _queue_runs_args(c)
    arrays = [array("q", column) for column in ints]
    assert _norm_entries(_core_fn("queue_entry_runs")(topics, *arrays)) == want
    assert _norm_entries(queue_entry_runs_python(topics, *arrays)) == want
    spans = [array("q", c[name]) for name in ("offsets", "positions", "sizes")]
    runs = back_to_back_runs_python(c["offsets"], c["positions"], c["sizes"])
    assert _core_fn("back_to_back_runs")(*spans) == back_to_back_runs_python(*spans) == runs


@compiled
def test_columns_of_another_kind_are_declined_and_the_twin_answers() -> None:
    """An array of another typecode (or a tuple) is not a column the compiled calls
    take: they decline (None) and tide.format's functions answer from the twins."""
    args: tuple[Any, ...] = (["T", "T"], [0, 0], [0, 0], [5, 6], [0, 10], [10, 10], [0, 0])
    want = _norm_entries(queue_entry_runs_python(*args))
    for kind in (lambda xs: array("i", xs), tuple):
        other = (args[0], *(kind(column) for column in args[1:]))
        assert _core_fn("queue_entry_runs")(*other) is None
        assert _norm_entries(queue_entry_runs(*other)) == want
        spans = (kind([0, 10]), kind([0, 10]), kind([10, 10]))
        assert _core_fn("back_to_back_runs")(*spans) is None
        assert back_to_back_runs(*spans) == [(0, 20, 0)]


@compiled
def test_equal_topics_that_are_distinct_objects_are_one_queue() -> None:
    a, b = "orders", "".join(["ord", "ers"])
    assert a is not b
    args = ([a, b, a], [1, 1, 1], [0, 0, 0], [5, 6, 7], [0, 10, 20], [10, 10, 10], [0, 0, 0])
    entries = b"".join(pack_entry(offset, 10, 0) for offset in (0, 10, 20))
    assert (
        _core_fn("queue_entry_runs")(*args)
        == _norm_entries(queue_entry_runs_python(*args))
        == [("orders", 1, 5, entries)]
    )


@pytest.mark.parametrize(
    ("qos", "flags", "want_qos"),
    [
        ([5], [0], [5]),  # one record: a list (one put)
        ([5, 6], [0, 0], 5),  # two consecutive: the first
        ([5, 7], [0, 0], [5, 7]),  # a gap
        ([5, 5], [0, 0], [5, 5]),  # a repeat
        ([6, 5], [0, 0], [6, 5]),  # going back
        ([5, 0, 6], [0, SYSFLAG_TRANSACTION_PREPARED, 0], 5),  # prepared: no entry
        ([5, 0, 6], [0, SYSFLAG_TRANSACTION_ROLLBACK, 0], 5),  # rollback: no entry
        ([5, 6, 7], [0, SYSFLAG_TRANSACTION_COMMIT, 0], 5),  # commit: an entry
        ([I64[1] - 1, I64[1]], [0, 0], I64[1] - 1),  # at the top of int64
    ],
)
def test_edge_cases(qos: list[int], flags: list[int], want_qos: object) -> None:
    count = len(qos)
    kept = [i for i in range(count) if not is_queue_less(flags[i])]
    args = (["T"] * count, [0] * count, flags, qos, list(range(count)), [1] * count, [3] * count)
    want = [("T", 0, want_qos, kept, [1] * len(kept), [3] * len(kept))]
    assert _norm(queue_runs_python(*args)) == want
    entries = b"".join(pack_entry(offset, 1, 3) for offset in kept)
    assert _norm_entries(queue_entry_runs(*args)) == [("T", 0, want_qos, entries)]


def test_a_queue_whose_records_all_take_no_entry_is_left_out() -> None:
    flags = [SYSFLAG_TRANSACTION_PREPARED, 0, SYSFLAG_TRANSACTION_ROLLBACK]
    args = (["A", "B", "A"], [0, 0, 0], flags, [0, 9, 0], [0, 1, 2], [1, 1, 1], [0, 0, 0])
    want = [("B", 0, [9], [1], [1], [0])]
    assert _norm(queue_runs_python(*args)) == want
    assert _norm_entries(queue_entry_runs(*args)) == [("B", 0, [9], pack_entry(1, 1, 0))]


def test_queues_come_in_the_order_first_met_even_by_a_record_taking_no_entry() -> None:
    flags = [SYSFLAG_TRANSACTION_PREPARED, 0, 0]
    args = (["A", "B", "A"], [0, 0, 0], flags, [0, 9, 4], [0, 1, 2], [1, 1, 1], [0, 0, 0])
    want = [("A", 0, [4], [2], [1], [0]), ("B", 0, [9], [1], [1], [0])]
    assert _norm(queue_runs_python(*args)) == want
    assert _norm_entries(queue_entry_runs(*args)) == [
        ("A", 0, [4], pack_entry(2, 1, 0)),
        ("B", 0, [9], pack_entry(1, 1, 0)),
    ]


@pytest.mark.parametrize(
    ("positions", "sizes", "want"),
    [([], [], []), ([0], [5], [5]), ([I64[1] - 1], [1], [I64[1]]), ([I64[1]], [1], [1 << 63])],
)
def test_record_ends_edges(positions: list[int], sizes: list[int], want: list[int]) -> None:
    assert record_ends_python(positions, sizes) == want


@pytest.mark.parametrize(
    ("offsets", "positions", "sizes", "want"),
    [
        ([], [], [], []),
        ([100], [0], [10], [(100, 110, 0)]),
        ([100, 110, 120], [0, 10, 20], [10, 10, 5], [(100, 125, 0)]),
        # a gap in the commitlog (a blank marker's filler)
        ([100, 118, 128], [0, 10, 20], [10, 10, 5], [(100, 110, 0), (118, 133, 10)]),
        # a gap in data only (a record joined from two chunks before the rest)
        ([100, 110], [0, 50], [10, 10], [(100, 110, 0), (110, 120, 50)]),
        # sizes that add up but offsets that do not follow them
        ([0, 5, 10], [0, 5, 10], [10, 0, 1], [(0, 10, 0), (5, 5, 5), (10, 11, 10)]),
        # zero and negative sizes (damaged columns)
        ([0, 0, 0], [0, 0, 0], [0, 0, 0], [(0, 0, 0)]),
        ([10, 5], [10, 5], [-5, 3], [(10, 8, 10)]),
    ],
)
def test_back_to_back_runs_edges(
    offsets: list[int], positions: list[int], sizes: list[int], want: list[Any]
) -> None:
    assert back_to_back_runs_python(offsets, positions, sizes) == want
    assert back_to_back_runs(offsets, positions, sizes) == want


@compiled
@pytest.mark.parametrize(
    ("offsets", "positions", "sizes"),
    [
        ([], [], []),
        ((0,), [0], [1]),
        ([0, 1], [0], [1, 1]),
        ([1 << 62], [0], [1]),
        ([0], [0], [1 << 70]),
        ([0], [0], ["1"]),
    ],
)
def test_back_to_back_runs_declines_what_it_does_not_take(
    offsets: Any, positions: Any, sizes: Any
) -> None:
    assert _core_fn("back_to_back_runs")(offsets, positions, sizes) is None


DAMAGED = (0, 1, -1, 7, I64[0], I64[1], 1 << 63, -(1 << 64), 1 << 62)


def _damaged_column(rnd: random.Random, count: int) -> list[int]:
    return [rnd.choice(DAMAGED) if rnd.random() < 0.3 else rnd.randrange(50) for _ in range(count)]


@compiled
@pytest.mark.parametrize("seed", range(20))
def test_back_to_back_runs_of_damaged_columns_equal_the_twin_or_decline(seed: int) -> None:
    """Random ints anywhere (negative, huge, repeated): an equal answer, or None."""
    rnd = random.Random(seed)
    for _ in range(50):
        count = rnd.randrange(1, 12)
        offsets, positions, sizes = (_damaged_column(rnd, count) for _ in range(3))
        got_runs = _core_fn("back_to_back_runs")(offsets, positions, sizes)
        assert got_runs is None or got_runs == back_to_back_runs_python(offsets, positions, sizes)


def _entry_runs_by_record(c: dict[str, list[Any]]) -> list[Any]:
    """The rule read plainly: each queue's run with its entries packed one by one."""
    return [
        (topic, queue_id, qos, b"".join(map(pack_entry, offsets, sizes, codes)))
        for topic, queue_id, qos, offsets, sizes, codes in _queue_runs_by_record(c)
    ]


def _norm_entries(runs: list[Any] | None) -> list[Any] | None:
    if runs is None:
        return None
    return [
        (topic, queue_id, qos if isinstance(qos, int) else list(qos), entries)
        for topic, queue_id, qos, entries in runs
    ]


@pytest.mark.parametrize("seed", range(60))
def test_queue_entry_runs_twins_and_the_rule_agree(seed: int) -> None:
    c = _batch(random.Random(seed))
    want = _entry_runs_by_record(c)
    assert _norm_entries(queue_entry_runs_python(*_queue_runs_args(c))) == want
    assert _norm_entries(queue_entry_runs(*_queue_runs_args(c))) == want


@compiled
@pytest.mark.parametrize("seed", range(30))
def test_queue_entry_runs_compiled_answers_live_shapes(seed: int) -> None:
    """Not declined (so measured) for what a scan gives: lists of ints that fit."""
    c = _batch(random.Random(seed))
    got = _core_fn("queue_entry_runs")(*_queue_runs_args(c))
    assert got is not None and _norm_entries(got) == _entry_runs_by_record(c)


@compiled
@pytest.mark.parametrize(
    "args",
    [
        # not exact lists
        (("T",), [0], [0], [0], [0], [1], [0]),
        # lengths that differ
        (["T", "T"], [0], [0], [0], [0], [1], [0]),
        # an int that does not fit in 64 bits
        (["T"], [1 << 64], [0], [0], [0], [1], [0]),
        (["T"], [0], [0], [1 << 63], [0], [1], [0]),
        (["T"], [0], [-(1 << 70)], [0], [0], [1], [0]),
        # not an int, not a str
        (["T"], [True], [0], [0], [0], [1], [0]),
        ([b"T"], [0], [0], [0], [0], [1], [0]),
        # more than 64 queues
        (["T"] * 65, list(range(65)), [0] * 65, [0] * 65, [0] * 65, [1] * 65, [0] * 65),
        # an entry's fields that do not fit: offset and code 64 bits, size 32
        (["T"], [0], [0], [0], [1 << 63], [1], [0]),
        (["T"], [0], [0], [0], [0], [1 << 31], [0]),
        (["T"], [0], [0], [0], [0], [-(1 << 31) - 1], [0]),
        (["T"], [0], [0], [0], [0], [1], [1 << 63]),
        (["T"], [0], [0], [0], [0], [1.0], [0]),
    ],
)
def test_queue_entry_runs_declines_what_it_does_not_take(args: tuple[Any, ...]) -> None:
    assert _core_fn("queue_entry_runs")(*args) is None


def test_queue_entry_runs_of_values_that_do_not_fit_raise_from_the_twin() -> None:
    with pytest.raises((OverflowError, struct.error)):
        queue_entry_runs(["T"], [0], [0], [0], [0], [1 << 31], [0])


def test_queue_entry_runs_of_more_than_64_queues_come_from_the_twin() -> None:
    count = 200
    args = (
        ["T"] * count,
        [i % 100 for i in range(count)],
        [0] * count,
        [i // 100 for i in range(count)],
        list(range(count)),
        [1] * count,
        [0] * count,
    )
    runs = _norm_entries(queue_entry_runs(*args))
    assert runs is not None and runs == _norm_entries(queue_entry_runs_python(*args))
    assert [run[1] for run in runs] == list(range(100))
    assert runs[0][3] == pack_entry(0, 1, 0) + pack_entry(100, 1, 0)


@compiled
@pytest.mark.parametrize("seed", range(20))
def test_queue_entry_runs_of_damaged_columns_equal_the_twin_or_decline(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(50):
        count = rnd.randrange(1, 12)
        topics = [rnd.choice(["a", "b"]) for _ in range(count)]
        args: tuple[Any, ...] = (topics, *(_damaged_column(rnd, count) for _ in range(6)))
        got = _core_fn("queue_entry_runs")(*args)
        try:
            want = _norm_entries(queue_entry_runs_python(*args))
        except (OverflowError, struct.error):
            assert got is None
            continue
        assert got is None or _norm_entries(got) == want
